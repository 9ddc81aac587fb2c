"""Drafters propose tokens for the target to verify. All share the Drafter interface."""
from engine.drafters.assistant_fit import AssistantMismatch, check_assistant_fits, is_assistant_config
from engine.drafters.base import Draft, Drafter, DrafterMismatch
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.gemma4_assistant import Gemma4AssistantDrafter
from engine.drafters.mtp_layers import MtpLayersDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter

__all__ = [
    "AssistantMismatch",
    "Draft",
    "Drafter",
    "DrafterMismatch",
    "DraftModelDrafter",
    "Gemma4AssistantDrafter",
    "MtpLayersDrafter",
    "PromptLookupDrafter",
    "check_assistant_fits",
    "is_assistant_config",
]
