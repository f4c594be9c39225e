"""pytest set-up for syncnorm's Python tests: the package from the source tree (python/) and
the libraries from the build tree CTest passes in SYNCNORM_LIBRARY_DIR."""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(here)), "python"))
sys.path.insert(0, here)
