"""Drafters: the proposers that plug into the one decode loop."""

from specdec_lab.drafters.base import DecodeState, Draft, Drafter
from specdec_lab.drafters.draft_model import DraftModelDrafter
from specdec_lab.drafters.lookahead import LookaheadDrafter
from specdec_lab.drafters.medusa import MedusaDrafter, MedusaHeads
from specdec_lab.drafters.mtp import MTPDrafter, MTPHeads
from specdec_lab.drafters.prompt_lookup import PromptLookupDrafter
from specdec_lab.drafters.suffix import SuffixDrafter

__all__ = ["DecodeState", "Draft", "Drafter", "DraftModelDrafter", "LookaheadDrafter", "MedusaDrafter", "MedusaHeads",
           "MTPDrafter", "MTPHeads", "PromptLookupDrafter", "SuffixDrafter"]
