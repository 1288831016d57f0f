import os
import sys

# The test oracle (tracereader) lives beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
