"""A test HTTPS server for client metadata documents, with a throwaway CA (trustme).

Usage: cimd_server.py DIR
Writes DIR/ca.pem, serves files from DIR/docs over https on 127.0.0.1 (certificate valid for
`localhost` and `127.0.0.1`), and prints `READY <port>` once listening. A file `X.cache-control`
next to `X` sets that response's Cache-Control header. Special paths, for attack tests:
  /redirect/<name>  302 to /<name>
  /slow/<name>      sends headers, then drips the body one byte per second
Runs until stdin closes (the test process exits), or until killed with `--forever`.
"""

import http.server
import os
import ssl
import sys
import threading
import time

import trustme

root = sys.argv[1]
docs = os.path.join(root, "docs")
os.makedirs(docs, exist_ok=True)

ca = trustme.CA()
ca.cert_pem.write_to_path(os.path.join(root, "ca.pem"))
cert = ca.issue_cert("localhost", "127.0.0.1")


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_GET(self):
        path = self.path.split("?", 1)[0]
        if path.startswith("/redirect/"):
            self.send_response(302)
            self.send_header("Location", "/" + path[len("/redirect/"):])
            self.end_headers()
            return
        slow = path.startswith("/slow/")
        name = path[len("/slow/"):] if slow else path.lstrip("/")
        file = os.path.join(docs, name)
        if "/" in name or not os.path.isfile(file):
            self.send_response(404)
            self.end_headers()
            return
        with open(file, "rb") as f:
            body = f.read()
        self.send_response(200)
        ctype = "image/png" if name.endswith(".png") else "application/json"
        self.send_header("Content-Type", ctype)
        cc = file + ".cache-control"
        if os.path.isfile(cc):
            with open(cc) as f:
                self.send_header("Cache-Control", f.read().strip())
        if not slow:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if slow:
                for b in body:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(1)
            else:
                self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
server.daemon_threads = True
context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
cert.configure_cert(context)
server.socket = context.wrap_socket(server.socket, server_side=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"READY {server.server_address[1]}", flush=True)
if "--forever" in sys.argv[2:]:
    threading.Event().wait()
else:
    sys.stdin.read()
