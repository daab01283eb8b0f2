"""The plan the way `sparkstack plan` makes it: this host's inputs (launcher/gather/here.py) and
the ranks' facts given, then plan.build; for tests that plan from fixture facts."""

from launcher.gather import here
from launcher.plan import cluster_plan as plan


def build_plan(loaded, facts=None, key=None) -> plan.Plan:
    return plan.build(loaded, here.inputs(loaded, facts, key))
