"""The report: compare strategies from MLflow in a markdown table and figures
(``python scripts/report.py --help``, ``python -m bidswarm.report``).

One job per module, read in this order:

- :mod:`~bidswarm.report.reading`: the runs of a sweep or an experiment from MLflow, each a
  ``RunResult``, grouped into strategies;
- :mod:`~bidswarm.report.strategies`: each strategy's numbers (held-out reward with its
  interval over (training seed, world) cells, paired differences, pass@k, winning bids);
- :mod:`~bidswarm.report.tables`: the markdown tables and the verdict;
- :mod:`~bidswarm.report.figures`: the figures (``FIGURES``);
- :mod:`~bidswarm.report.command`: ``write_report``, the command line, the report logged to
  MLflow and spliced into ``docs/results.md``.
"""
