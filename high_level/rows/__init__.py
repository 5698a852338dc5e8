"""Row-based windows (OOP §5.2, dissertation §5.1.2-3): the high level's pane operator over host row numbers."""
