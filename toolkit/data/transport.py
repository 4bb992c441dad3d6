"""Where data comes from: a local path, an http(s) URL (streamed, with a bearer token that
never follows a redirect to another host) or any fsspec URL (s3://, gs://, file://).
Shards, shard lists, indexes and data lists are all read through `open_shard`, so every
input form meets the same errors and the same credentials rule; what the bytes mean is
the readers' business (toolkit.data.shard_tar, toolkit.data.shards)."""
import os
import posixpath
import re
import urllib.error
import urllib.parse
import urllib.request
from typing import BinaryIO

HTTP_TIMEOUT_S = 60.0
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(source: str) -> str:
    m = _SCHEME.match(source)
    return m.group(1).lower() if m else ""


def auth_token(configured: str = "") -> str:
    """The bearer token for http(s) shards: the config's, else TOOLKIT_DATA_TOKEN."""
    return configured or os.environ.get("TOOLKIT_DATA_TOKEN", "")


def keeps_credentials(old_url: str, new_url: str) -> bool:
    """Whether a redirect from `old_url` to `new_url` may carry the bearer token: only to
    the same host, scheme and port (http -> https on the default ports too), as the
    `requests` package decides; a CDN or another host never sees it."""
    a, b = urllib.parse.urlsplit(old_url), urllib.parse.urlsplit(new_url)
    if (a.hostname or "").lower() != (b.hostname or "").lower():
        return False
    default = {"http": 80, "https": 443}
    port_a, port_b = a.port or default.get(a.scheme), b.port or default.get(b.scheme)
    if (a.scheme, port_a, b.scheme, port_b) == ("http", 80, "https", 443):
        return True
    return a.scheme == b.scheme and port_a == port_b


class _RedirectWithoutForeignToken(urllib.request.HTTPRedirectHandler):
    """urllib copies every header onto the redirected request, Authorization included."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and not keeps_credentials(req.full_url, new.full_url):
            new.remove_header("Authorization")
        return new


_OPENER = urllib.request.build_opener(_RedirectWithoutForeignToken)


def open_shard(source: str, timeout: float = HTTP_TIMEOUT_S, token: str = "") -> BinaryIO:
    """Binary, sequentially readable file object for a local path, an http(s) URL
    (streamed, never read whole into memory) or any fsspec URL (s3://, gs://, file://).

    I/O failures raise OSError naming the source (the dataset counts them as skipped
    utterances); a scheme nothing can open raises ImportError/ValueError (a setup error)."""
    scheme = url_scheme(source)
    if not scheme:
        return open(source, "rb")
    if scheme in ("http", "https"):
        request = urllib.request.Request(source)
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            return _OPENER.open(request, timeout=timeout)
        except urllib.error.HTTPError as err:
            raise OSError(f"cannot open shard {source}: HTTP {err.code} {err.reason}") from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise OSError(f"cannot open shard {source}: {reason}") from None
    try:
        import fsspec
    except ImportError:
        raise ImportError(f"cannot open shard {source}: '{scheme}://' URLs need fsspec and its "
                          f"backend for that scheme: pip install fsspec (plus e.g. s3fs, "
                          f"gcsfs, adlfs)") from None
    try:
        return fsspec.open(source, "rb").open()
    except ValueError as err:
        # fsspec raises ValueError("Protocol not known: ...") for schemes it has no class for.
        raise ValueError(f"cannot open shard {source}: fsspec has no backend for "
                         f"'{scheme}://' ({err}); install the package that provides it") from None
    except ImportError as err:
        raise ImportError(f"cannot open shard {source}: the fsspec backend for '{scheme}://' "
                          f"is not installed ({err})") from None
    except OSError as err:
        raise OSError(f"cannot open shard {source}: {err}") from None


def read_bytes(source: str, token: str = "") -> bytes:
    with open_shard(source, token=token) as f:
        return f.read()


def read_text(source: str, token: str = "") -> str:
    """A shard list or data list, local or by URL, as text."""
    return read_bytes(source, token or auth_token()).decode("utf-8")


def beside(source: str, name: str) -> str:
    """`name` in the same directory as `source` (a path or a URL)."""
    if url_scheme(source):
        parts = urllib.parse.urlsplit(source)
        path = posixpath.join(posixpath.dirname(parts.path), name)
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return os.path.join(os.path.dirname(os.path.abspath(source)), name)


def file_name(source: str) -> str:
    """The file name of a path or URL; a URL's query (signed URLs) is not part of it."""
    if url_scheme(source):
        return posixpath.basename(urllib.parse.urlsplit(source).path)
    return os.path.basename(source)
