"""A stand-in inference endpoint for the scale-out benchmark: answers every POST with an image
after a fixed delay (default 100 ms), many requests at once."""
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

port, image, delay = int(sys.argv[1]), open(sys.argv[2], "rb").read(), float(sys.argv[3]) if len(sys.argv) > 3 else 0.1


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        time.sleep(delay)
        self.send_response(200)
        self.send_header("Content-Type", "image/jpeg")
        self.send_header("Content-Length", str(len(image)))
        self.end_headers()
        self.wfile.write(image)

    def log_message(self, *args):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
