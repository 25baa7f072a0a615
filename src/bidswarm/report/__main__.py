"""``python -m bidswarm.report``: the report's command line (:mod:`bidswarm.report.command`)."""

from bidswarm.report.command import main

if __name__ == "__main__":
    main()
