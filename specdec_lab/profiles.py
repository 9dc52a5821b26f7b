"""Reading a tuner profile back: the draft length and tree budget `specdec tune` chose for a method and a
temperature, as drafter settings (`generate(..., tuned=...)`, `specdec ... --tuned`).

Measuring and writing a profile is `specdec_lab.tune`'s job; this module only reads one, so decoding with a
profile needs none of the tuner's measuring code.
"""

from __future__ import annotations

import json
from pathlib import Path

FORMAT = "specdec-tune/1"


def load_profile(profile: str | Path | dict) -> dict:
    """A profile from a JSON file written by `specdec tune` (or the dict itself); checks its format."""
    if isinstance(profile, dict):
        data = profile
    else:
        path = Path(profile)
        if not path.is_file():
            raise FileNotFoundError(f"no tuner profile at {path}: write one with `specdec tune --out {path}`")
        data = json.loads(path.read_text())
    if data.get("format") != FORMAT:
        raise ValueError(f"not a specdec tuner profile (format {data.get('format')!r}, expected {FORMAT!r})")
    return data


def tuned_settings(profile: str | Path | dict, method: str, temperature: float) -> dict:
    """The drafter keyword arguments a profile chose for `method` at `temperature`.

    profile: a path or a loaded profile; method: "draft" (returns {"k"}), "eagle" ({"depth"}) or
    "eagle-tree" ({"total_tokens", "depth", "top_k"}, plus "alpha" when sampling); temperature: the run's
    (0 reads the greedy choice, > 0 the sampled one).
    """
    data = load_profile(profile)
    key = "greedy" if temperature == 0 else "sampled"
    if key not in data["choices"]:
        raise ValueError(f"the profile has no {key} choice (it was tuned at temperatures "
                         f"{[c['temperature'] for c in data['choices'].values()]}); rerun `specdec tune`")
    choice = data["choices"][key]["choice"]
    if method not in choice:
        raise ValueError(f"the profile has no setting for {method!r} (it has {sorted(choice)})")
    return dict(choice[method])


def apply_profile(drafter, profile: str | Path | dict, temperature: float) -> None:
    """Set a drafter's draft length or tree budget from a profile, in place (other drafters are refused).

    drafter: a `DraftModelDrafter` or an `EagleDrafter`; profile: a path or a loaded profile; temperature:
    the run's.
    """
    from specdec_lab.drafters.draft_model import DraftModelDrafter
    from specdec_lab.drafters.eagle import EagleDrafter

    if isinstance(drafter, DraftModelDrafter):
        drafter.k = tuned_settings(profile, "draft", temperature)["k"]
    elif isinstance(drafter, EagleDrafter):
        method = "eagle" if drafter.mode == "chain" else "eagle-tree"
        for name, value in tuned_settings(profile, method, temperature).items():
            setattr(drafter, name, value)
        drafter._shapes.clear()
    else:
        raise ValueError(f"a tuner profile sets draft-model and EAGLE drafters only, not {type(drafter).__name__}")
