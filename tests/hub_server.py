"""A stand-in for the Hugging Face hub on 127.0.0.1, enough for huggingface_hub's real client:
`snapshot_download` (repo info, the recursive tree listing) and `hf_hub_download` (HEAD and GET
of `/{repo}/resolve/{revision}/{file}`). Each repository serves folders of files by commit; a
branch or tag names a commit. Every request is logged as (method, path)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


class HubServer:
    def __init__(self):
        self.repos: dict[str, dict] = {}  # repo_id -> {"refs": {name: sha}, "commits": {sha: dir}}
        self.requests: list[tuple[str, str]] = []
        self._server = None

    def add(self, repo_id: str, folder: Path, *, refs=("main",)) -> str:
        """Serves `folder` as a new commit of `repo_id`, which each name in `refs` points to;
        returns the commit hash."""
        sha = hashlib.sha1(f"{repo_id}{folder}{len(self.repos)}".encode()).hexdigest()
        repo = self.repos.setdefault(repo_id, {"refs": {}, "commits": {}})
        repo["commits"][sha] = Path(folder)
        for ref in refs:
            repo["refs"][ref] = sha
        return sha

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubServer:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_HEAD(self):
                hub._answer(self, body=False)

            def do_GET(self):
                hub._answer(self, body=True)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- answers ------------------------------------------------------------------------------
    def _find(self, repo_id: str, revision: str):
        """(sha, folder) or (error code, None)."""
        repo = self.repos.get(repo_id)
        if repo is None:
            return "RepoNotFound", None
        sha = revision if revision in repo["commits"] else repo["refs"].get(revision)
        if sha is None:
            return "RevisionNotFound", None
        return sha, repo["commits"][sha]

    def _answer(self, handler: BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlsplit(handler.path).path)
        self.requests.append((handler.command, path))
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] in ("revision", "tree"):
            repo_id, kind, revision = "/".join(parts[2:4]), parts[4], "/".join(parts[5:])
            sha, folder = self._find(repo_id, revision)
            if folder is None:
                return self._error(handler, sha)
            files = sorted(p for p in folder.rglob("*") if p.is_file())
            if kind == "revision":
                data = {"id": repo_id, "modelId": repo_id, "sha": sha, "private": False,
                        "siblings": [{"rfilename": str(p.relative_to(folder))} for p in files]}
            else:
                data = [{"type": "file", "path": str(p.relative_to(folder)),
                         "size": p.stat().st_size, "oid": hashlib.sha1(p.read_bytes()).hexdigest()}
                        for p in files]
            return self._send(handler, json.dumps(data).encode(), {"Content-Type":
                                                                   "application/json"}, body)
        if len(parts) >= 5 and parts[2] == "resolve":
            repo_id, revision, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
            sha, folder = self._find(repo_id, revision)
            if folder is None:
                return self._error(handler, sha)
            file = folder / name
            if not file.is_file():
                return self._error(handler, "EntryNotFound")
            data = file.read_bytes()
            etag = f'"{hashlib.sha256(data).hexdigest()}"'
            return self._send(handler, data, {"X-Repo-Commit": sha, "ETag": etag}, body)
        return self._error(handler, "RepoNotFound")

    @staticmethod
    def _send(handler, data: bytes, headers: dict, body: bool) -> None:
        handler.send_response(200)
        for key, value in headers.items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if body:
            handler.wfile.write(data)

    @staticmethod
    def _error(handler, code: str) -> None:
        message = json.dumps({"error": code}).encode()
        handler.send_response(404)
        handler.send_header("X-Error-Code", code)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(message)))
        handler.end_headers()
        if handler.command != "HEAD":
            handler.wfile.write(message)
