"""Private directories: owned by this user, not writable by anyone else, not a symlink.

Control directories (on-demand requests), per-node registries and staging directories hold
files that other users must not plant, swap or read; one check for all of them.
"""

from __future__ import annotations

import os
import stat

from torchprof_args.errors import TorchProfileArgsError

__all__ = ["check_private_dir", "ensure_private_dir"]


def check_private_dir(
    path: str | os.PathLike[str], flag: str = "--torch-profile-on-demand-dir"
) -> str | None:
    """Why ``path`` is not a safe private directory (a sentence naming ``flag``), or None when it is.

    Safe: a real directory (not a symlink), owned by the current user, not group- or
    world-writable, so nobody else can plant or swap the files in it (trace requests, publish
    jobs, staged traces).
    """
    try:
        info = os.lstat(path)
    except OSError as err:
        return f"{flag} {str(path)!r} cannot be read ({err.strerror or err})."
    if stat.S_ISLNK(info.st_mode):
        return f"{flag} {str(path)!r} is a symbolic link; give the real directory."
    if not stat.S_ISDIR(info.st_mode):
        return f"{flag} {str(path)!r} is not a directory."
    if info.st_uid != os.getuid():
        return (f"{flag} {str(path)!r} is owned by uid {info.st_uid}, not by you (uid {os.getuid()}): "
                "others could plant or read the files in it. Choose a directory of your own.")
    if info.st_mode & 0o022:
        return (f"{flag} {str(path)!r} is group- or world-writable (mode {stat.S_IMODE(info.st_mode):o}): "
                f"others could plant files in it. Run 'chmod 700 {path}' or choose another directory.")
    return None


def ensure_private_dir(path: str, flag: str, error: type[Exception] = TorchProfileArgsError) -> None:
    """Create ``path`` (mode 0700, parents as needed) if missing, then require it to be private;
    raises ``error`` with a sentence naming ``flag``."""
    try:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as err:
        raise error(f"{flag} {path!r} cannot be created ({err.strerror or err}); "
                    "choose a directory you can write to.") from None
    problem = check_private_dir(path, flag)
    if problem:
        raise error(problem)

