import sys

from sharebert_runtime.main import main

sys.exit(main())
