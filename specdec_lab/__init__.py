"""specdec_lab: speculative decoding, taught and implemented.

    import specdec_lab as sd
    pair = sd.load_pair()                       # the shipped zoo pair, offline
    out = sd.generate(pair.target, ids, drafter=sd.DraftModelDrafter(pair.draft, k=4))
    out.tokens, out.stats.mean_accepted_tokens
    batch = sd.generate_batch(pair.target, [ids, other_ids], drafter=sd.DraftModelDrafter(pair.draft, k=4))
"""

from specdec_lab.batch import BatchGenerationOutput, generate_batch
from specdec_lab.decode import GenerationOutput, StepRecord, generate
from specdec_lab.drafters import DecodeState, Draft, Drafter, DraftModelDrafter, PromptLookupDrafter
from specdec_lab.drafters.eagle import EagleDrafter, EagleHead
from specdec_lab.drafters.jacobi import jacobi_decode
from specdec_lab.drafters.lookahead import LookaheadDrafter
from specdec_lab.drafters.medusa import MedusaDrafter, MedusaHeads
from specdec_lab.drafters.mtp import MTPDrafter, MTPHeads
from specdec_lab.drafters.suffix import SuffixDrafter
from specdec_lab.models import ModelPair, load_model, load_pair, zoo_path
from specdec_lab.sampling import SamplingConfig, process_logits
from specdec_lab.stats import DecodeStats
from specdec_lab.tree import DraftTree
from specdec_lab.verify import Verdict, verify_block, verify_greedy, verify_rejection

__all__ = [
    "DecodeState", "DecodeStats", "Draft", "DraftModelDrafter", "Drafter", "GenerationOutput", "ModelPair",
    "PromptLookupDrafter", "SamplingConfig", "StepRecord", "Verdict", "generate", "load_model", "load_pair",
    "process_logits", "verify_greedy", "verify_rejection", "zoo_path",
    "LookaheadDrafter", "jacobi_decode",
    "DraftTree", "MedusaDrafter", "MedusaHeads",
    "EagleDrafter", "EagleHead",
    "BatchGenerationOutput", "generate_batch",
    "SuffixDrafter", "verify_block",
    "MTPDrafter", "MTPHeads",
]
