"""`python -m services.sim`: see services.sim.run."""

from services.sim.run import main

if __name__ == "__main__":
    main()
