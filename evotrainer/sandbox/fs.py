"""Host-side file access to folders sandboxed code could write: never through a link, a FIFO, a
device, a long path or a deep recursion.

Sandboxed code (pytest run on a policy's repository, an analyzer with a work dir) can leave
anything in its work dir: a link to a root-only host file, a folder link, a FIFO that blocks the
first reader, a path longer than ``PATH_MAX`` (4,096 bytes), a tree 1,100 folders deep. Everything
the host does with such a folder goes through this module:

* :func:`open_beneath` opens a relative path under a trusted directory fd without following a link
  on any component: ``openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)``
  (Linux >= 5.6, called through ctypes) where the kernel has it, else a walk that opens each
  component with ``O_NOFOLLOW`` relative to the previous one's fd. ``..`` is refused lexically.
* :func:`read_file` / :func:`read_chunks` / :func:`write_file`: regular files only. Opened with ``O_NONBLOCK`` (so a FIFO
  cannot block the open) and checked with ``fstat`` before any byte is read or the file truncated.
* :func:`walk`: every entry below a folder, iterative (no recursion limit) and fd-based (no path
  string is ever resolved, so no ``PATH_MAX``); it descends with ``O_NOFOLLOW`` and climbs with
  ``..`` checked against the (device, inode) it came from, so one fd is open at any depth.
* :func:`clean_work_dir` (after every sandbox run with a caller's work dir), :func:`copy_tree`
  (grading works on a fresh copy), :func:`remove_tree` (deep trees that ``shutil.rmtree`` cannot
  remove on Python < 3.12: it recurses).

The walk is not built to race a live writer: callers use it after the sandbox's processes are gone
(the pid namespace or container died with the run); a folder swapped under it is detected by the
inode check and raises :class:`UnsafePathError` rather than being followed.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path

from evotrainer.errors import EvoTrainerError
from evotrainer.sandbox.base import SandboxError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x02, 0x04, 0x08
_SYS_OPENAT2 = 437  # same number on x86_64 and aarch64 (<asm-generic/unistd.h>)


class UnsafePathError(EvoTrainerError, OSError):
    """A path that is a link, goes through one, leaves the trusted folder, or is not a regular file."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@functools.lru_cache(maxsize=1)
def _libc():
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_openat2_works: list[bool] = [True]  # set False after the first ENOSYS / EPERM (seccomp) / no libc


def _openat2(dir_fd: int, rel: str, flags: int, mode: int) -> int | None:
    """An fd from openat2(RESOLVE_BENEATH | NO_SYMLINKS | NO_MAGICLINKS); None where the kernel lacks it."""
    libc = _libc()
    if not _openat2_works[0] or libc is None:
        return None
    how = _OpenHow(flags | os.O_CLOEXEC, mode if flags & os.O_CREAT else 0,
                   _RESOLVE_BENEATH | _RESOLVE_NO_SYMLINKS | _RESOLVE_NO_MAGICLINKS)
    fd = libc.syscall(ctypes.c_long(_SYS_OPENAT2), ctypes.c_long(dir_fd), os.fsencode(rel), ctypes.byref(how),
                      ctypes.c_size_t(ctypes.sizeof(how)))
    if fd >= 0:
        return fd
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EPERM, errno.E2BIG):
        _openat2_works[0] = False
        return None
    if err in (errno.ELOOP, errno.EXDEV):
        raise UnsafePathError(err, "a link on the path (the host does not follow links here)", rel)
    raise OSError(err, os.strerror(err), rel)


def split_relative(rel: str) -> list[str]:
    """The components of a relative path (``.`` and empty dropped); ``ValueError`` on ``/x`` or ``..``."""
    if rel.startswith("/"):
        raise ValueError(f"path {rel!r} is absolute; give a path relative to the folder")
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ValueError(f"path {rel!r} goes up with '..'; give a path inside the folder")
    return parts


def open_beneath(dir_fd: int, rel: str, flags: int = os.O_RDONLY, mode: int = 0o644) -> int:
    """Open ``rel`` relative to the trusted directory ``dir_fd`` following no link on any component.

    ``rel`` ``""`` or ``"."`` opens (a new fd of) the folder itself. ``O_NOFOLLOW`` and ``O_CLOEXEC``
    are added. Raises :class:`UnsafePathError` (a link on the way), ``ValueError`` (absolute or
    ``..``), or the ``OSError`` of the open (``FileNotFoundError``, ``NotADirectoryError``...).
    """
    parts = split_relative(rel)
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if not parts:
        return os.open(".", flags | os.O_DIRECTORY, dir_fd=dir_fd)
    fd = _openat2(dir_fd, "/".join(parts), flags, mode)
    if fd is not None:
        return fd
    cur = dir_fd
    try:
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            try:
                nxt = os.open(part, flags if last else _DIR_FLAGS, mode, dir_fd=cur)
            except OSError as e:
                if e.errno == errno.ELOOP or (e.errno == errno.ENOTDIR and _is_link(cur, part)):
                    raise UnsafePathError(errno.ELOOP, "a link on the path (the host does not follow links here)",
                                          "/".join(parts[: i + 1])) from None
                raise
            if cur != dir_fd:
                os.close(cur)
            cur = nxt
        return cur
    except BaseException:
        if cur != dir_fd:
            os.close(cur)
        raise


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def lstat_beneath(dir_fd: int, rel: str) -> os.stat_result:
    """``lstat`` of ``rel`` under ``dir_fd``: its parents are opened without following links; the
    entry itself is not followed (a link comes back as a link)."""
    parts = split_relative(rel)
    if not parts:
        return os.fstat(dir_fd)
    parent = open_beneath(dir_fd, "/".join(parts[:-1]), os.O_RDONLY | os.O_DIRECTORY)
    try:
        return os.stat(parts[-1], dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(parent)


def _kind(mode: int) -> str:
    return ("directory" if stat.S_ISDIR(mode) else "link" if stat.S_ISLNK(mode) else "FIFO" if stat.S_ISFIFO(mode)
            else "socket" if stat.S_ISSOCK(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "file")


def _open_regular(dir_fd: int, rel: str, flags: int) -> int:
    fd = open_beneath(dir_fd, rel, flags | os.O_NONBLOCK | os.O_NOCTTY)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UnsafePathError(errno.EINVAL, f"not a regular file (a {_kind(st.st_mode)})", rel)
    return fd


READ_CHUNK_BYTES = 1 << 20  # 1 MiB per read: few syscalls, and a caller hashing a huge file holds one chunk at a time


def read_chunks(dir_fd: int, rel: str, max_bytes: int | None = None,
                chunk_bytes: int = READ_CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of the regular file ``rel`` under ``dir_fd`` in chunks of at most ``chunk_bytes`` (at most
    ``max_bytes`` in all; None: to the end), opened as :func:`read_file` opens it (no link followed, no FIFO).

    Memory stays at one chunk whatever the file's size (a digest of a repo a sandboxed run filled with a
    multi-GB file). The file is opened at the first ``next()`` (its errors are raised there: ``UnsafePathError``,
    ``FileNotFoundError``...) and closed when the iteration ends or the generator is closed.
    ``ValueError`` when ``chunk_bytes`` < 1.
    """
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes={chunk_bytes}: give a chunk size of at least 1 byte")
    fd = _open_regular(dir_fd, rel, os.O_RDONLY)
    try:
        left = max_bytes if max_bytes is not None else float("inf")
        while left > 0 and (chunk := os.read(fd, int(min(left, chunk_bytes)))):
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)


def read_file(dir_fd: int, rel: str, max_bytes: int | None = None) -> bytes:
    """The bytes of the regular file ``rel`` under ``dir_fd`` (at most ``max_bytes``); see :func:`open_beneath`."""
    return b"".join(read_chunks(dir_fd, rel, max_bytes))


def write_file(dir_fd: int, rel: str, data: bytes, *, create: bool = False, mode: int = 0o644) -> None:
    """Replace the content of the regular file ``rel`` (``create``: a new file, which must not exist)."""
    flags = os.O_WRONLY | (os.O_CREAT | os.O_EXCL if create else 0)
    fd = _open_regular(dir_fd, rel, flags) if not create else open_beneath(dir_fd, rel, flags, mode)
    try:
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def makedirs_beneath(dir_fd: int, rel: str, mode: int = 0o755) -> None:
    """Create the folders of ``rel`` under ``dir_fd`` (existing real folders kept; a link is an error)."""
    cur = os.dup(dir_fd)
    try:
        for part in split_relative(rel):
            try:
                os.mkdir(part, mode, dir_fd=cur)
            except FileExistsError:
                pass
            nxt = open_beneath(cur, part, os.O_RDONLY | os.O_DIRECTORY)
            os.close(cur)
            cur = nxt
    finally:
        os.close(cur)


# --- walking -----------------------------------------------------------------------------------------
Entry = tuple[int, str, str, os.stat_result]  # (parent dir fd, name, relative path, lstat)


def walk(root: str | Path | int, *, leave: Callable[[int, str, str], None] | None = None,
         enter: Callable[[int, str, str], None] | None = None,
         prune: Callable[[str, os.stat_result], bool] | None = None,
         onerror: Callable[[str, OSError], None] | None = None) -> Iterator[Entry]:
    """Every entry below ``root`` (a trusted folder path or fd), parents before children, names sorted.

    Yields ``(dir_fd, name, rel, st)``: ``st`` is the entry's ``lstat``; ``dir_fd`` its parent, open
    while the caller handles the entry (act with ``dir_fd=`` and ``name``, never with ``rel``). Links
    are reported, never followed. ``prune(rel, st)`` True: do not descend into that folder.
    ``enter(fd, name, rel)`` runs after descending into a folder (``fd`` is the folder), ``leave(fd,
    name, rel)`` after climbing back out (``fd`` is its parent: the place to ``rmdir``).
    ``onerror(rel, exc)`` gets an entry that cannot be read or opened (default: raise). Iterative, one
    directory fd open at any depth. Raises :class:`UnsafePathError` if a folder is swapped mid-walk.
    """
    fd = os.dup(root) if isinstance(root, int) else os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    st0 = os.fstat(fd)
    # one frame per level: (names left, rel, (dev, ino) of the folder, its name)
    stack: list[tuple[list[str], str, tuple[int, int], str]] = []

    def listing(rel: str) -> list[str]:
        try:
            return sorted(os.listdir(fd), reverse=True)
        except OSError as e:
            if onerror is None:
                raise
            onerror(rel, e)
            return []

    try:
        stack.append((listing(""), "", (st0.st_dev, st0.st_ino), ""))
        while stack:
            names, rel, _ident, name_here = stack[-1]
            if not names:
                stack.pop()
                if not stack:
                    break
                up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
                os.close(fd)
                fd = up
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) != stack[-1][2]:
                    raise UnsafePathError(errno.EXDEV, "folder moved during the walk", rel)
                if leave is not None:
                    leave(fd, name_here, rel)
                continue
            name = names.pop()
            sub = f"{rel}/{name}" if rel else name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            except OSError as e:
                if onerror is None:
                    raise
                onerror(sub, e)
                continue
            yield fd, name, sub, st
            if not stat.S_ISDIR(st.st_mode) or (prune is not None and prune(sub, st)):
                continue
            try:
                down = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as e:
                if onerror is None:
                    raise
                onerror(sub, e)
                continue
            got = os.fstat(down)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                os.close(down)
                raise UnsafePathError(errno.EXDEV, "folder swapped during the walk", sub)
            os.close(fd)
            fd = down
            if enter is not None:
                enter(fd, name, sub)
            stack.append((listing(sub), sub, (st.st_dev, st.st_ino), name))
    finally:
        os.close(fd)


def remove_tree(path: str | Path) -> None:
    """Remove ``path`` and everything below it without following links, at any depth or path length.

    A missing ``path`` is fine. ``OSError`` from an entry that cannot be removed.
    """
    path = Path(path)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(path)
        return
    for fd, name, _rel, est in walk(path, leave=lambda pfd, n, _r: os.rmdir(n, dir_fd=pfd)):
        if not stat.S_ISDIR(est.st_mode):
            os.unlink(name, dir_fd=fd)
    os.rmdir(path)


def shared_hard_links(root: str | Path) -> list[tuple[str, os.stat_result]]:
    """``(path, lstat)`` of each non-folder below ``root`` hard-linked to a name outside ``root``, sorted.

    An inode whose link count is larger than the number of its names in the tree has a name elsewhere
    (``cp -al``, ``git clone --local``, a uv / pip cache): writing it through the tree writes the outside
    file too. One path per inode; links themselves are never followed; any depth (:func:`walk`).
    """
    found: dict[tuple[int, int], tuple[list[str], os.stat_result]] = {}
    for _fd, _name, rel, st in walk(root):
        if not stat.S_ISDIR(st.st_mode):
            found.setdefault((st.st_dev, st.st_ino), ([], st))[0].append(rel)
    return sorted((rels[0], st) for rels, st in found.values() if st.st_nlink > len(rels))


Owners = dict[tuple[int, int], tuple[int, int]]  # (st_dev, st_ino) -> (uid, gid)


def lend_tree(root: str | Path, uid: int, gid: int) -> Owners:
    """Give ``root`` and the entries below it to ``uid:gid`` for a run; returns the owners for :func:`return_tree`.

    A non-folder with more links than names in the tree (a hard link shared with a path outside
    ``root``: ``cp -al``, ``git clone --local``, a uv / pip cache) is *not* lent: it keeps its owner
    and mode, so the run reads it as "other" and cannot write through it to the outside path (a
    plain chown gave the outside file to the run: checked on Docker 20.10, a sandbox appended to a
    uid-1000 file outside the work dir and the file came back root's). Links themselves, never their
    targets; any depth (:func:`walk`). ``OSError`` on the first entry that cannot be read or changed
    (the entries lent so far are given back first).
    """
    st = os.lstat(root)
    owners: Owners = {(st.st_dev, st.st_ino): (st.st_uid, st.st_gid)}
    names: dict[tuple[int, int], int] = {}
    links: dict[tuple[int, int], int] = {}
    for _fd, _name, _rel, est in walk(root):
        key = (est.st_dev, est.st_ino)
        owners[key] = (est.st_uid, est.st_gid)
        if not stat.S_ISDIR(est.st_mode):
            names[key] = names.get(key, 0) + 1
            links[key] = est.st_nlink
    shared = {k for k, n in names.items() if links[k] > n}
    try:
        os.chown(root, uid, gid, follow_symlinks=False)
        for fd, name, _rel, est in walk(root):
            if (est.st_dev, est.st_ino) not in shared:
                os.chown(name, uid, gid, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return_tree(root, owners)  # half lent: every entry back to its owner, then the error
        raise
    return owners


def return_tree(root: str | Path, owners: Owners) -> int:
    """Give every entry below ``root`` back the owner it had before :func:`lend_tree` (matched by device and
    inode, so renames inside the tree keep their owner); entries made since get ``root``'s old owner.

    Linux clears setuid/setgid on a chown of a regular file. Returns the number of entries changed;
    ``OSError`` on the first that fails. Caveat: an inode freed during the run and reused for a new
    entry gets the freed entry's owner (one the tree already had).
    """
    st = os.lstat(root)
    default = owners.get((st.st_dev, st.st_ino), (st.st_uid, st.st_gid))
    changed = 0
    if (st.st_uid, st.st_gid) != default:
        os.chown(root, *default, follow_symlinks=False)
        changed += 1
    for fd, name, _rel, est in walk(root):
        want = owners.get((est.st_dev, est.st_ino), default)
        if (est.st_uid, est.st_gid) != want:
            os.chown(name, *want, dir_fd=fd, follow_symlinks=False)
            changed += 1
    return changed


_UNSAFE_BITS = stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH


def clean_work_dir(root: str | Path, root_mode: int | None = None) -> int:
    """Clear setuid, setgid and world-write bits below ``root``; reset ``root`` to ``root_mode``.

    Why this runs although bwrap binds the work dir ``nosuid`` (bwrap adds ``MS_NOSUID | MS_NODEV`` to
    every bind, checked in /proc/self/mountinfo): ``nosuid`` holds inside the sandbox only. The files
    stay on the host's file system, where the host's mount has no ``nosuid``, and a sandbox run as
    host root writes them as host uid 0 (the sandbox uid maps to the caller's): a ``chmod u+s`` file
    left there is a setuid-root program for any host user who can reach it, a 0777 folder one they
    can plant in.

    Regular files and folders are fixed with ``fchmod`` on an ``O_NOFOLLOW`` fd checked to be the
    entry the walk saw; links (their mode means nothing on Linux), FIFOs and sockets are left.
    Returns the number of entries changed. Fails closed: raises :class:`evotrainer.sandbox.base.SandboxError`
    naming up to 3 entries when any could not be read or fixed (the run must not count as a success).
    """
    problems: list[str] = []
    changed = 0

    def fix(dir_fd: int, name: str, st: os.stat_result, rel: str) -> None:
        nonlocal changed
        want = stat.S_IMODE(st.st_mode) & ~_UNSAFE_BITS
        if want == stat.S_IMODE(st.st_mode):
            return
        flags = (_DIR_FLAGS if stat.S_ISDIR(st.st_mode) else
                 os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
        fd = os.open(name, flags, dir_fd=dir_fd) if name else os.dup(dir_fd)
        try:
            got = os.fstat(fd)
            if (got.st_dev, got.st_ino) != (st.st_dev, st.st_ino):
                raise UnsafePathError(errno.EXDEV, "entry swapped during the cleanup", rel)
            os.fchmod(fd, want)
            changed += 1
        finally:
            os.close(fd)

    root = Path(root)
    try:
        rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise SandboxError(f"could not clean the work dir {root}: cannot open it ({e.strerror})") from e
    try:
        st = os.fstat(rfd)
        try:
            want = (root_mode if root_mode is not None else stat.S_IMODE(st.st_mode)) & ~_UNSAFE_BITS
            if stat.S_IMODE(st.st_mode) != want:
                os.fchmod(rfd, want)
                changed += 1
        except OSError as e:
            problems.append(f".: {e.strerror}")
        for dir_fd, name, rel, est in walk(rfd, onerror=lambda r, e: problems.append(f"{r}: {e.strerror}")):
            if stat.S_ISREG(est.st_mode) or stat.S_ISDIR(est.st_mode):
                try:
                    fix(dir_fd, name, est, rel)
                except OSError as e:
                    problems.append(f"{rel[:200]}: {e.strerror}")
    except OSError as e:
        problems.append(f"(walk) {e}")
    finally:
        os.close(rfd)
    if problems:
        n = len(problems)
        raise SandboxError(f"could not clean the work dir {root}: {n} entr{'y' if n == 1 else 'ies'} left with "
                           f"setuid/setgid/world-write bits or unreadable ({'; '.join(problems[:3])}); the run's "
                           "result is withheld. Remove the folder as root (`rm -rf`, after `chattr -i` where set)")
    return changed


def copy_tree(src: str | Path, dest: str | Path, *, skip: Callable[[str, os.stat_result], bool] | None = None
              ) -> int:
    """Copy ``src`` into the new folder ``dest``: folders, regular files (content; mode less setuid,
    setgid and group/other write) and links as links (never followed); FIFOs, sockets and devices
    are left out, as is every entry with ``skip(rel, lstat)`` True. Any depth, any path length.

    Returns the number of files and links copied. Raises ``FileExistsError`` when ``dest`` exists.
    """
    dest = Path(dest)
    os.mkdir(dest, 0o755)
    dfd = [os.open(dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]  # the dest folder matching the walk's
    n = 0

    def enter(_fd: int, name: str, _rel: str) -> None:
        nxt = os.open(name, _DIR_FLAGS, dir_fd=dfd[0])
        os.close(dfd[0])
        dfd[0] = nxt

    def leave(_fd: int, _name: str, _rel: str) -> None:
        up = os.open("..", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dfd[0])
        os.close(dfd[0])
        dfd[0] = up

    def pruned(rel: str, st: os.stat_result) -> bool:
        return skip is not None and skip(rel, st)

    try:
        for fd, name, rel, st in walk(src, enter=enter, leave=leave, prune=pruned):
            if pruned(rel, st):
                continue
            mode = stat.S_IMODE(st.st_mode) & 0o755
            if stat.S_ISDIR(st.st_mode):
                os.mkdir(name, 0o755, dir_fd=dfd[0])
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(name, dir_fd=fd), name, dir_fd=dfd[0])
                n += 1
            elif stat.S_ISREG(st.st_mode):
                write_file(dfd[0], name, read_file(fd, name), create=True, mode=mode | 0o600)
                n += 1
    finally:
        os.close(dfd[0])
    return n
