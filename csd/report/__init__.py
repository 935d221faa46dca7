"""The report stage: sweep tables, Pareto plots and content-awareness plots from evaluated runs."""

from csd.report.build import build_report
from csd.report.callback import SweepReportCallback

__all__ = ["SweepReportCallback", "build_report"]
