from shared.cli import main

main(["run", "reconciler"])
