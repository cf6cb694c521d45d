"""The command line: parse, wire, render, exit. No logic lives here."""
