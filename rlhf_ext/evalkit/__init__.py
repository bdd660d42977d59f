"""evalkit: math benchmark evaluation (AIME, MATH-500, GSM8K, AMC23) on vLLM with honest statistics.

Not yet implemented: this package will hold the ``evalkit`` command line, generation, grading and metrics.
"""
