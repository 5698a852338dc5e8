"""Live results with update semantics (UpStream): provisional values of open windows, the update queue
that serves them to one consumer under overload, and the staleness it achieves."""
