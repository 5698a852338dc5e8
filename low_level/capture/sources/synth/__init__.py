"""The synthetic traffic model behind ``low_level.capture.sources.generator``: groups and parameters
(``model``), the Numba frame builder (``frames``) and the answer schedule with the generating kernels
(``schedule``)."""
