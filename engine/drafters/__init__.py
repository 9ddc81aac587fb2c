"""Drafters propose tokens for the target to verify. All share the Drafter interface."""
from engine.drafters.base import Draft, Drafter
from engine.drafters.draft_model import DraftModelDrafter
from engine.drafters.prompt_lookup import PromptLookupDrafter

__all__ = ["Draft", "Drafter", "DraftModelDrafter", "PromptLookupDrafter"]
