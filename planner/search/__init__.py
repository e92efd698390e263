"""Search over partitionings: declared space, AMSP sharding choice, ranking, confirmation."""

from planner.search.search import Ranked, SearchRequest, SearchResult, prepare, search

__all__ = ["Ranked", "SearchRequest", "SearchResult", "prepare", "search"]
