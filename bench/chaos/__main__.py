"""``python -m bench.chaos``: the chaos soak (``bench.chaos.runner.main``; its help is the package's docstring)."""

from bench.chaos.runner import main

if __name__ == "__main__":
    main()
