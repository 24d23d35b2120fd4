"""prepare_wikitext2 against a local HTTP server on 127.0.0.1 (never the internet)."""

import functools
import io
import random
import threading
import zipfile
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exatrain.data import WIKITEXT2_FILES, load_corpus, prepare_wikitext2
from exatrain.errors import DataError
from tests.ports import free_port


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture
def server(tmp_path):
    """Serve tmp_path/www on 127.0.0.1; yields (www_dir, base_url)."""
    www = tmp_path / "www"
    www.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(www)))
    t = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield www, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def make_zip(path: Path, files=WIKITEXT2_FILES) -> Path:
    """A WikiText-2-like zip of about 1 MB (stored, so the download has many chunks)."""
    rng = random.Random(0)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("wikitext-2/", "")
        for name in files:
            split = name.split(".")[1]
            lines = [f" = {split} = \n", "\n"]
            lines += [" ".join(f"w{rng.randrange(5000)}" for _ in range(12)) + " \n" for _ in range(5000)]
            zf.writestr(f"wikitext-2/{name}", "".join(lines))
    return path


def closed_port() -> int:
    """A port nobody listens on (connection refused, as on an offline node)."""
    return free_port()


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir()) if parent.exists() else []


def test_download_extract_and_load(server, tmp_path):
    www, base = server
    make_zip(www / "wikitext-2-v1.zip")
    out = tmp_path / "data" / "nested" / "wikitext-2"
    log = io.StringIO()
    got = prepare_wikitext2(out, url=f"{base}/wikitext-2-v1.zip", log=log)
    assert got == out.absolute()
    assert sorted(p.name for p in out.iterdir()) == sorted(WIKITEXT2_FILES)
    assert leftovers(out.parent) == ["wikitext-2"]  # no staging directory left
    text = log.getvalue()
    assert "downloading http://127.0.0.1" in text and "(100%)" in text and "ready" in text
    assert text.count("%)") >= 5  # progress about every 10 %

    c = load_corpus("wikitext", out, tmp_path / "cache")
    assert "train" in c.vocab and len(c.splits["train"]) > 0

    # second call: nothing to download (the server is not even asked)
    log2 = io.StringIO()
    prepare_wikitext2(out, url=f"http://127.0.0.1:{closed_port()}/x.zip", log=log2)
    assert "nothing to do" in log2.getvalue()


def test_existing_out_dir_gets_the_files(server, tmp_path):
    www, base = server
    make_zip(www / "w.zip")
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    prepare_wikitext2(out, url=f"{base}/w.zip", log=io.StringIO())
    assert sorted(p.name for p in out.iterdir()) == sorted([*WIKITEXT2_FILES, "keep.txt"])
    assert leftovers(tmp_path) == ["out", "www"]


def assert_clean_failure(exc: pytest.ExceptionInfo, url: str, out: Path, reason: str) -> None:
    msg = str(exc.value)
    assert url in msg and reason in msg, msg
    assert "HINT:" in msg and "login node" in msg and "data.path" in msg
    assert not out.exists()


def test_connection_refused(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}/wikitext-2-v1.zip"
    out = tmp_path / "a" / "b" / "wt2"
    with pytest.raises(DataError) as e:
        prepare_wikitext2(out, url=url, timeout=5, log=io.StringIO())
    assert_clean_failure(e, url, out, "refused")
    assert leftovers(tmp_path) == []  # the parents it created are gone too


def test_not_a_zip_and_http_error(server, tmp_path):
    www, base = server
    (www / "page.zip").write_text("<html>captive portal</html>")
    out = tmp_path / "wt2"
    with pytest.raises(DataError) as e:
        prepare_wikitext2(out, url=f"{base}/page.zip", log=io.StringIO())
    assert_clean_failure(e, f"{base}/page.zip", out, "not a valid zip")
    with pytest.raises(DataError) as e:
        prepare_wikitext2(out, url=f"{base}/missing.zip", log=io.StringIO())
    assert_clean_failure(e, f"{base}/missing.zip", out, "HTTP 404")
    assert leftovers(tmp_path) == ["www"]


def test_zip_without_the_files(server, tmp_path):
    www, base = server
    make_zip(www / "char.zip", files=("wiki.train.raw", "wiki.valid.raw", "wiki.test.raw"))
    out = tmp_path / "wt2"
    with pytest.raises(DataError) as e:
        prepare_wikitext2(out, url=f"{base}/char.zip", log=io.StringIO())
    assert_clean_failure(e, f"{base}/char.zip", out, "lacks wiki.train.tokens")


def test_existing_out_dir_untouched_on_failure(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(DataError):
        prepare_wikitext2(out, url=f"http://127.0.0.1:{closed_port()}/x.zip", log=io.StringIO())
    assert leftovers(out) == ["keep.txt"] and leftovers(tmp_path) == ["out"]


def test_default_mirrors_are_all_named_on_failure(tmp_path, monkeypatch):
    import exatrain.data.prepare as prepare

    port = closed_port()
    mirrors = (f"http://127.0.0.1:{port}/one.zip", f"http://127.0.0.1:{port}/two.zip")
    monkeypatch.setattr(prepare, "WIKITEXT2_URLS", mirrors)
    with pytest.raises(DataError) as e:
        prepare.prepare_wikitext2(tmp_path / "wt2", timeout=5, log=io.StringIO())
    assert all(m in str(e.value) for m in mirrors)


def test_file_url_of_a_hand_copied_zip(tmp_path):
    z = make_zip(tmp_path / "wikitext-2-v1.zip")
    out = tmp_path / "wt2"
    prepare_wikitext2(out, url=z.as_uri(), log=io.StringIO())
    assert sorted(p.name for p in out.iterdir()) == sorted(WIKITEXT2_FILES)
