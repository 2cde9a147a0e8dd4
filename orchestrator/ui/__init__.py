"""Terminal rendering with rich: core code reports events, this package turns them into bars and tables."""
