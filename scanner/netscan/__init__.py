"""Network exposure sweep: which TCP ports of a host answer from this vantage.

``scan.run(ScanRequest)`` resolves the host, picks a method (raw SYN with scapy when
privileged, else ``connect()``), probes a bounded port set and returns a
:class:`~scanner.netscan.model.ScanResult` of attempt records; ``policy.findings`` turns
open ports the policy's ``ports:`` section does not allow from this vantage into findings.
"""
