#!/usr/bin/python3
"""Trims an upstream CRD for the 1.20 test API server, which refuses what
later API servers take: descriptions (kept out for size only), CEL rules
(`x-kubernetes-validations`, 1.25+), and empty-string defaults (a list's
map key without a default is made required instead). Everything else of
the schema stays as upstream ships it.

  tests/crds/trim.py SOURCE.yaml 'HEADER LINE' ... > tests/crds/NAME.yaml
"""
import sys

import yaml


def strip(o):
    if isinstance(o, dict):
        o = {
            k: strip(v)
            for k, v in o.items()
            if k not in ("description", "x-kubernetes-validations")
            and not (k == "default" and v == "")
        }
        keys = o.get("x-kubernetes-list-map-keys")
        if keys and "items" in o:
            props = o["items"].get("properties", {})
            required = o["items"].setdefault("required", [])
            for k in keys:
                if k not in required and "default" not in props.get(k, {}):
                    required.append(k)
        return o
    if isinstance(o, list):
        return [strip(v) for v in o]
    return o


source, header = sys.argv[1], sys.argv[2:]
docs = [d for d in yaml.safe_load_all(open(source)) if d]
for line in header:
    print(f"# {line}")
print(yaml.safe_dump(strip(docs[0]), sort_keys=False, width=120), end="")
