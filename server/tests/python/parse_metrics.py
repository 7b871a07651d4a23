"""Parses a /metrics body (stdin) with the Prometheus Python client's text
parser, the reference implementation of the format, and prints every sample
as JSON: {"family", "type", "help", "name", "labels", "value"} a line.
Exits non-zero (with the parser's message) if any part does not parse."""

import json
import sys

from prometheus_client.parser import text_string_to_metric_families

text = sys.stdin.read()
for family in text_string_to_metric_families(text):
    for s in family.samples:
        print(
            json.dumps(
                {
                    "family": family.name,
                    "type": family.type,
                    "help": family.documentation,
                    "name": s.name,
                    "labels": s.labels,
                    "value": s.value,
                }
            )
        )
