"""Compare strategies from MLflow (``bidswarm.report``): ``python scripts/report.py --help``."""

from bidswarm.report.command import main

if __name__ == "__main__":
    main()
