"""``python -m insitubatch.testing.emulator ROOT``: serve ROOT until SIGINT/SIGTERM, printing its URL first."""

from .cli import main
from .server import Emulator

if __name__ == "__main__":
    raise SystemExit(main(Emulator))
