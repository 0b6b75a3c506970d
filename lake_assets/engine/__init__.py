"""The feed-agnostic merge engine: normalised change events in, current and history out."""
