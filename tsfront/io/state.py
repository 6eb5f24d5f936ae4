"""The state directory: what the engines told this I/O process, kept for its successor.

TokenSpeed engines handshake once, when they start. Their ZeroMQ sockets reconnect by
themselves and keep their routing identity, so an I/O process that binds the same addresses
after its predecessor died reaches the same engines; what it lacks is only what the engines
told the old one, their registrations. With ``ClientConfig.state_dir`` set, the I/O process
keeps them on disk:

* ``group.json``: the group the directory belongs to (the three addresses as configured,
  ``first_engine_index``, ``num_engines``), written once; a directory written for another
  group is refused with `StateDirMismatch`.
* ``engine-<index>.json``: one per registered engine (its identity, rank, output address and
  registration), written atomically (temporary file, fsync, rename, fsync of the directory)
  when the engine registers, removed when it is known dead (ENGINE_CORE_DEAD, replaced by a
  new process of the same identity, or not back within ``handshake_timeout`` after a
  restart) and when the I/O process is stopped on purpose.
* ``lock``: held (``flock``) for the I/O process's life, so two I/O processes never share one
  directory; the kernel releases it when the process dies, however it dies.

`Adoption` is what a new I/O process does with the registrations it finds: see its docstring.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from dataclasses import dataclass

import msgspec

from tsfront.config import ClientConfig
from tsfront.errors import ConfigError, StateDirInUse, StateDirMismatch
from tsfront.wire import EngineRegistration, engine_identity

log = logging.getLogger("tsfront.io")

FORMAT = 1
GROUP_FILE = "group.json"
LOCK_FILE = "lock"
ENGINE_PREFIX = "engine-"
GROUP_FIELDS = (
    "handshake_address",
    "input_address",
    "output_address",
    "first_engine_index",
    "num_engines",
)


def group_of(config: ClientConfig) -> dict:
    """What identifies a group of engines: the addresses they dial and their identities."""
    return {name: getattr(config, name) for name in GROUP_FIELDS}


@dataclass(frozen=True)
class SavedEngine:
    """One engine's registration as a previous I/O process saved it."""

    index: int
    row: int
    output_address: str
    registration: EngineRegistration


def _write_atomically(directory: str, name: str, data: bytes) -> None:
    # Readers (a successor) see the old file or the new one, never a torn one; the directory
    # fsync makes the rename itself survive a machine crash.
    final = os.path.join(directory, name)
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, final)
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class StateDir:
    """The state directory of one I/O process (see the module docstring)."""

    def __init__(self, config: ClientConfig) -> None:
        assert config.state_dir is not None
        self.path = os.path.abspath(config.state_dir)
        self.group = group_of(config)
        self._lock_fd = -1

    def open(self) -> list[SavedEngine]:
        """Lock the directory, check (or write) its group, and return the saved engines.

        Raises `StateDirInUse` if another live I/O process holds it, `StateDirMismatch` if it
        was written for another group, `ConfigError` if it cannot be created or written.
        """
        try:
            os.makedirs(self.path, mode=0o700, exist_ok=True)
            fd = os.open(os.path.join(self.path, LOCK_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as exc:
            raise ConfigError(
                f"state_dir={self.path!r} cannot be used: {exc}; give a writable directory"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise StateDirInUse(
                f"state_dir={self.path!r} is held by another running I/O process (pid "
                f"{holder}); stop it first, or give this one its own directory"
            ) from None
        self._lock_fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        try:
            self._check_group()
            return self._load()
        except BaseException:
            self.close()
            raise

    def _check_group(self) -> None:
        path = os.path.join(self.path, GROUP_FILE)
        try:
            with open(path, "rb") as f:
                saved = json.loads(f.read())
        except FileNotFoundError:
            saved = None
        except (OSError, ValueError) as exc:
            raise StateDirMismatch(
                f"state_dir={self.path!r}: {GROUP_FILE} is unreadable ({exc}); if its group "
                "is gone, remove the directory, or point state_dir at an empty one"
            ) from None
        if saved is None:
            if self._engine_files():
                raise StateDirMismatch(
                    f"state_dir={self.path!r} holds engine registrations but no {GROUP_FILE}: "
                    "it was not written by tsfront; point state_dir at an empty directory"
                )
            body = {"format": FORMAT, "group": self.group}
            _write_atomically(self.path, GROUP_FILE, json.dumps(body, indent=1).encode())
            return
        group = saved.get("group") if isinstance(saved, dict) else None
        if not isinstance(group, dict) or saved.get("format") != FORMAT:
            raise StateDirMismatch(
                f"state_dir={self.path!r}: {GROUP_FILE} is not a tsfront group file of format "
                f"{FORMAT}; point state_dir at an empty directory"
            )
        diffs = [
            f"{name}={group.get(name)!r} there, {self.group[name]!r} here"
            for name in GROUP_FIELDS
            if group.get(name) != self.group[name]
        ]
        if diffs:
            raise StateDirMismatch(
                f"state_dir={self.path!r} belongs to another engine group ({'; '.join(diffs)}): "
                "start with that group's config to take its engines over, or give this group "
                "its own state directory (remove the old one only if its engines are gone)"
            )

    def _engine_files(self) -> list[str]:
        return sorted(
            n for n in os.listdir(self.path) if n.startswith(ENGINE_PREFIX) and n.endswith(".json")
        )

    def _load(self) -> list[SavedEngine]:
        first = self.group["first_engine_index"]
        count = self.group["num_engines"]
        saved: list[SavedEngine] = []
        for name in os.listdir(self.path):
            if name.startswith(".") and name.endswith(".tmp"):
                # A write its process died in the middle of: never renamed, so never valid.
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.path, name))
        for name in self._engine_files():
            try:
                with open(os.path.join(self.path, name), "rb") as f:
                    body = json.loads(f.read())
                index = body["index"]
                row = index - first
                if not (isinstance(index, int) and 0 <= row < count and body["row"] == row):
                    raise ValueError(f"engine {index!r} is not in {first}..{first + count - 1}")
                if bytes.fromhex(body["identity"]) != engine_identity(index):
                    raise ValueError("identity does not match the index")
                registration = msgspec.convert(body["registration"], EngineRegistration)
                saved.append(SavedEngine(index, row, str(body["output_address"]), registration))
            except (OSError, ValueError, KeyError, TypeError, msgspec.ValidationError) as exc:
                # Its engine must handshake again (a restart of that rank) to be used.
                log.warning("state_dir %s: ignoring %s: %s", self.path, name, exc)
        return saved

    def save(self, index: int, row: int, output_address: str, reg: EngineRegistration) -> None:
        """Record an engine's registration (atomically)."""
        body = {
            "format": FORMAT,
            "index": index,
            "row": row,
            "identity": engine_identity(index).hex(),
            "output_address": output_address,
            "registration": msgspec.structs.asdict(reg),
        }
        _write_atomically(self.path, f"{ENGINE_PREFIX}{index}.json", json.dumps(body).encode())

    def remove(self, index: int) -> None:
        """Forget an engine (it is known dead); no error if it was not recorded."""
        try:
            os.unlink(os.path.join(self.path, f"{ENGINE_PREFIX}{index}.json"))
        except FileNotFoundError:
            return
        _fsync_dir(self.path)

    def clear(self) -> None:
        """Forget every engine (the group is stopped on purpose); the group file stays."""
        for name in self._engine_files():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(self.path, name))
        _fsync_dir(self.path)

    def close(self) -> None:
        """Release the lock (the directory and its files stay)."""
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
