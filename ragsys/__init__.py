"""RAGSys re-ranking (Contal & McGoldrick 2024): relevance + MMR diversity + LM quality bias.

Depends only on numpy: any first stage supplies the relevance and the embeddings.
"""

from ragsys.mmr import VARIANTS, mmr_select, mmr_select_reference, select_variant

__all__ = ["VARIANTS", "mmr_select", "mmr_select_reference", "select_variant"]
