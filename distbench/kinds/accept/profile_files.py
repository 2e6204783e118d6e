"""Where acceptance profiles come from: the built-in ones (configs/profiles in a checkout, the
copy a wheel installs), a file read and validated (load), and --profile's value resolved to one
(resolve: auto, a built-in's name, or a file of the user's, which may not take a built-in's
name).

No torch here: the command line's validation and accept --dry-run read profiles.
"""

from __future__ import annotations

import os
import site
import stat
import sys
from pathlib import Path

from distbench.kinds.accept.profile_model import AUTO, Profile, ProfileError
from distbench.kinds.accept.profile_toml import parse, shown


def _checkout_dir() -> Path | None:
    """configs/profiles of the repository this module runs from (a checkout, or an editable
    install of one); None when installed from a wheel. pyproject.toml beside it tells a
    repository from a site-packages that happens to hold a configs/ folder."""
    import distbench

    root = Path(distbench.__file__).resolve().parents[1]  # the folder holding the package
    found = root / "configs" / "profiles"
    return found if (root / "pyproject.toml").is_file() and found.is_dir() else None


def profile_dirs() -> list[Path]:
    """Where the built-in profiles are, first found first: the repository's configs/profiles
    when running from a checkout, then the copy a wheel installs (pyproject.toml's data-files:
    share/distbench/profiles under the environment's prefix, or under the user base after
    `pip install --user`)."""
    candidates = [_checkout_dir()]
    for base in (sys.prefix, site.getuserbase()):
        candidates.append(Path(base) / "share" / "distbench" / "profiles")
    out: list[Path] = []
    for d in candidates:
        if d is not None and d.is_dir() and d.resolve() not in {o.resolve() for o in out}:
            out.append(d)
    return out


def builtin_paths() -> dict[str, Path]:
    """Built-in profile name -> its file; a name in two folders is the first folder's."""
    found: dict[str, Path] = {}
    for d in profile_dirs():
        for path in sorted(d.glob("*.toml")):
            found.setdefault(path.stem, path)
    return found


def available() -> list[str]:
    return sorted(builtin_paths())


def load(path: Path) -> Profile:
    """Read and validate a profile file; raises ProfileError naming the file and the key."""
    path = Path(path)
    try:
        return parse(path.read_text(encoding="utf-8"), path)
    except FileNotFoundError:
        raise ProfileError(f"no such file {shown(path)!r}") from None
    except IsADirectoryError:
        raise ProfileError(f"{shown(path)!r} is a directory, not a profile file") from None
    except OSError as e:
        raise ProfileError(f"cannot read {shown(path)!r}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ProfileError(f"{shown(path)}: not UTF-8 text") from None



def resolve(spec: str) -> Profile | None:
    """--profile's value: "auto" -> None (pick_for_nodes() decides once the topology is known);
    a file that exists -> that file; a built-in's name -> the built-in. Raises ProfileError."""
    text = str(spec).strip()
    if text.lower() == AUTO:
        return None
    if not text:
        raise ProfileError("empty value (give auto, a built-in profile's name or a TOML file)")
    path = Path(text)
    builtin = builtin_paths()
    if path.is_file():
        return _own(load(path), builtin)
    if text in builtin:
        return load(builtin[text])
    kind = _not_a_file(path)
    if kind is not None:
        raise ProfileError(f"{text!r} is {kind}, not a profile file")
    if path.suffix == ".toml" or os.sep in text or "/" in text:
        raise ProfileError(f"no such file {text!r}")
    names = ", ".join(builtin) or "none found"
    raise ProfileError(f"unknown profile {text!r} (available: {names}; or auto, or a TOML "
                       f"file)")


def _not_a_file(path: Path) -> str | None:
    """What is at `path` when it is there but no regular file (/dev/null, a folder, a pipe):
    "no such file" would send the operator looking for a file that is there."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return None
    if stat.S_ISLNK(mode):
        return "a broken symbolic link" if not path.exists() else _not_a_file(path.resolve())
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a named pipe"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return None if stat.S_ISREG(mode) else "not a regular file"


def _own(profile: Profile, builtin: dict[str, Path]) -> Profile:
    """A profile file of the user's, refused where its name is a built-in's (or auto): the
    verdict line, accept.json and accept.md name a profile by its name, and would present this
    file's checks and floors as the built-in's."""
    name = profile.name.lower()
    if name == AUTO:
        raise ProfileError(f"{shown(profile.path)}: key 'name': {profile.name!r} is what "
                           "--profile auto means: give this profile a name of its own")
    taken = next((b for b in builtin if b.lower() == name), None)
    if taken is None or _is_builtin_file(profile.path, taken):
        return profile
    raise ProfileError(f"{shown(profile.path)}: key 'name': {profile.name!r} is the name of "
                       f"a built-in profile ({shown(builtin[taken])}), and reports would take "
                       f"this file for it: give it a name of its own (such as "
                       f"\"{profile.name}-site\")")


def _is_builtin_file(path: Path, name: str) -> bool:
    """`path` is the built-in `name` itself, in any of the folders built-ins are read from."""
    real = path.resolve()
    return any((d / f"{name}.toml").resolve() == real for d in profile_dirs())



def builtin(name: str) -> Profile:
    path = builtin_paths().get(name)
    if path is None:
        raise ProfileError(f"built-in profile {name!r} not found in "
                           f"{', '.join(map(str, profile_dirs())) or 'any profile folder'}")
    return load(path)
