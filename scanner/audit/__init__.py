"""Drift audit: a live deployment against a baseline (directory or signed evidence pack).

``baseline`` loads and creates baselines, ``nginxconf`` compares NGINX configs with
crossplane, ``drift`` compares live observations with the baseline, ``metrics`` writes
Prometheus text, ``run`` wires the live checks together.
"""
