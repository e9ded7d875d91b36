"""Who may reach the private PostgreSQL: its passwords, its password file and its pg_hba.conf.

Why: the private server (``migrators.embedded_postgres``) listens on TCP 127.0.0.1, where every
local account can connect. Older versions initialised it with ``trust``: any local account
logged in as the superuser and could run ``COPY ... TO PROGRAM``, a shell as the server's user.
Now only the account that started it can log in:

- two roles, each with a generated password (32 random bytes): the superuser ``postgres``
  (sstore's writes: sinks, migrations, casts) and ``sstore_reader`` (LOGIN, member of
  ``pg_read_all_data`` only: every read path logs in as it, ``migrators.reader``);
- the passwords live in one password file beside the data directory
  (``<data_dir>.pgpass``, libpq's format, mode 0600, owned by the account that started the
  server); the URLs sstore hands out name that file (``?passfile=...``) and carry no password,
  so they can be shown, logged and exported as they are;
- ``pg_hba.conf`` allows only SCRAM-SHA-256 password logins (no ``trust``, no ``peer``), and
  the server has no Unix socket;
- the server learns only SCRAM verifiers (``scram_verifier``), never a password: not in
  ``initdb``'s password file, not in ``ALTER ROLE``, so not in its log either.

A data directory an older version made (``trust`` in its ``pg_hba.conf``) is upgraded in place
at the next start (``PrivatePostgres.start``): passwords set while ``trust`` still lets sstore
in, then ``pg_hba.conf`` rewritten and reloaded, and the start waits until the server has
loaded it. ``sstore postgres rotate-password`` replaces both passwords (``<data_dir>.pgpass.next``
first, then the server, then the rename: a crash part-way is settled at the next start).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from pathlib import Path

from sstore.base.files import write_atomically

SUPERUSER = "postgres"
READER = "sstore_reader"
#: the only authentication method the private server's ``pg_hba.conf`` names
METHOD = "scram-sha-256"
HBA = f"""# written by sstore (migrators.private_auth): password logins (SCRAM) only, never trust.
# The passwords are in the password file beside the data directory (mode 0600).
# TYPE  DATABASE  USER  ADDRESS  METHOD
local   all       all            {METHOD}
host    all       all   all      {METHOD}
"""
#: PostgreSQL's default number of PBKDF2 iterations for SCRAM-SHA-256
SCRAM_ITERATIONS = 4096


def passfile_path(data_dir: Path) -> Path:
    """The password file of the server on ``data_dir``: beside it, not in it (the data
    directory belongs to the server's own OS user when sstore runs as root; the password file
    belongs to the account that started sstore, and only it can read it)."""
    return data_dir.with_name(data_dir.name + ".pgpass")


def pending_path(passfile: Path) -> Path:
    """Where a rotation writes the new passwords before the server has them."""
    return passfile.with_name(passfile.name + ".next")


def new_password() -> str:
    """32 random bytes, URL-safe (no ``:`` or ``\\``, which the password file would escape)."""
    return secrets.token_urlsafe(32)


def read_passwords(path: Path) -> dict[str, str]:
    """role -> password from a password file sstore wrote (``*:*:*:role:password`` lines);
    empty when there is none."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    found = {}
    for line in text.splitlines():
        parts = line.split(":")
        if len(parts) == 5 and parts[:3] == ["*", "*", "*"]:
            found[parts[3]] = parts[4]
    return found


def write_passwords(path: Path, passwords: dict[str, str]) -> None:
    """Replace the password file whole, created with mode 0600 (libpq ignores a password file
    that others may read, and so must everyone else)."""
    lines = ["# written by sstore (migrators.private_auth): the private PostgreSQL's logins"]
    lines += [f"*:*:*:{role}:{password}" for role, password in passwords.items()]
    write_atomically(str(path), "\n".join(lines) + "\n", mode=0o600)
    path.chmod(0o600)


def passwords_for(path: Path) -> dict[str, str]:
    """Both roles' passwords: those of the password file, new ones for roles it lacks (the
    file is rewritten then). Kept when present, so an upgrade cut short by a crash resumes
    with the same passwords."""
    passwords = read_passwords(path)
    missing = [role for role in (SUPERUSER, READER) if role not in passwords]
    if missing:
        passwords |= {role: new_password() for role in missing}
        write_passwords(path, passwords)
    return passwords


def scram_verifier(password: str, salt: bytes | None = None,
                   iterations: int = SCRAM_ITERATIONS) -> str:
    """The SCRAM-SHA-256 verifier PostgreSQL stores for ``password`` (RFC 5802/7677, in
    PostgreSQL's ``SCRAM-SHA-256$iterations:salt$StoredKey:ServerKey`` form). Given as the
    password, PostgreSQL stores it as it is: the password itself never reaches the server."""
    salt = salt or secrets.token_bytes(16)
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations)
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    stored_key = hashlib.sha256(client_key).digest()
    server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()

    def b64(data: bytes) -> str:
        return base64.b64encode(data).decode()

    return f"SCRAM-SHA-256${iterations}:{b64(salt)}${b64(stored_key)}:{b64(server_key)}"


def hba_methods(data_dir: Path) -> set[str]:
    """The authentication methods ``pg_hba.conf`` names (the last word of each rule, options
    aside); empty when it cannot be read."""
    try:
        text = (data_dir / "pg_hba.conf").read_text()
    except OSError:
        return set()
    methods = set()
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if words:
            methods.add(next((w for w in reversed(words) if "=" not in w), words[-1]))
    return methods


def is_open(data_dir: Path) -> bool:
    """Whether ``pg_hba.conf`` lets anyone in by anything but a SCRAM password (an older
    version's ``trust``)."""
    methods = hba_methods(data_dir)
    return bool(methods - {METHOD, "reject"})


def write_hba(data_dir: Path, owner: tuple[int, int] | None) -> None:
    """Replace ``pg_hba.conf`` with sstore's (``HBA``); ``owner``: (uid, gid) of the server's
    OS user when it is not this process's."""
    path = data_dir / "pg_hba.conf"
    write_atomically(str(path), HBA, mode=0o600)
    if owner is not None:
        os.chown(path, *owner)


def protection(data_dir: Path, host: str, port: int) -> dict[str, object]:
    """How the server on ``data_dir`` is protected, for ``sstore postgres status``."""
    passfile = passfile_path(data_dir)
    try:
        mode: str | None = oct(passfile.stat().st_mode & 0o777)[2:].zfill(4)
    except OSError:
        mode = None
    open_ = is_open(data_dir)
    socket_dirs = _setting(data_dir, "unix_socket_directories")
    return {
        "authentication": "trust (OPEN to every local account: `sstore postgres start` "
                          "upgrades it)" if open_ else METHOD,
        "open": open_,
        "listens": f"{host}:{port} (TCP)",
        "unix_socket": socket_dirs or None,
        "password_file": str(passfile),
        "password_file_mode": mode,
        "roles": {SUPERUSER: "superuser: sstore's writes", READER: "pg_read_all_data: every "
                  "read path"},
    }


def describe(state: dict[str, object]) -> str:
    """One line from ``protection``'s answer."""
    if state["open"]:
        return f"protection: {state['authentication']}"
    socket = "no Unix socket" if not state["unix_socket"] else f"socket in {state['unix_socket']}"
    return (f"protection: {METHOD} passwords on {state['listens']}, {socket}; passwords in "
            f"{state['password_file']} (mode {state['password_file_mode']}); reads log in as "
            f"{READER}")


def _setting(data_dir: Path, name: str) -> str:
    try:
        text = (data_dir / "sstore.conf").read_text()
    except OSError:
        return ""
    found = re.search(rf"^{name} = '([^']*)'$", text, re.MULTILINE)
    return found.group(1) if found else ""
