"""The Kubernetes path, checked offline: the course's Zero to JupyterHub values file (hub/k8s/values.yaml)
merged over the chart's own defaults the way helm merges them, then validated against the chart's JSON schema.

The chart's values.yaml and values.schema.yaml are copied unchanged into hub/k8s/chart/ (see the README there);
helm validates the same merged values against the same schema before it renders anything.
"""

from __future__ import annotations

from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent / "k8s" / "chart"


class ValuesError(ValueError):
    """The values do not satisfy the chart's schema; the message lists each failing path."""


def merged(defaults: dict, values: dict) -> dict:
    """`values` over `defaults` as helm merges them: maps merge key by key, anything else replaces, and a null
    value removes the default."""
    out = dict(defaults)
    for key, value in values.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def validate(values: dict, chart: Path = CHART) -> dict:
    """Check `values` (a parsed values file) against the chart in `chart`; returns the merged values.
    Raises ValuesError naming every path that fails."""
    import jsonschema

    schema = yaml.safe_load((chart / "values.schema.yaml").read_text())
    full = merged(yaml.safe_load((chart / "values.yaml").read_text()), values)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(full), key=lambda e: list(e.absolute_path))
    if errors:
        raise ValuesError("; ".join(f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
                                    for e in errors))
    return full
