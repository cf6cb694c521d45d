"""The prober: plan + live target -> attempt records -> findings (see ``interface.py``)."""
