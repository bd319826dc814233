"""The simulated internet of the network tests, run inside the test's `inet`
network namespace (never anywhere else): an authoritative DNS server for the
`.test` names, HTTP (80) and HTTPS (443) servers on each name's address, and a
UDP sink (9999), and a TCP server on port 7000 of each address that accepts
connections and never reads, writes or closes them (a hostile sandbox's target).
Every DNS query, HTTP request and UDP datagram is appended to
log files in the world directory, so tests can prove what never arrived.

usage: world.py DIR RECORDS_JSON   (RECORDS_JSON: {"name": "ip", ...}; the DNS
server listens on the address of the name "ns.test")
"""
import json, os, socket, ssl, struct, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

DIR = sys.argv[1]
RECORDS = json.loads(sys.argv[2])
BY_IP = {}
for n, ip in RECORDS.items():
    BY_IP.setdefault(ip, n)
LOCK = threading.Lock()


def log(kind, line):
    with LOCK, open(os.path.join(DIR, kind + ".log"), "a") as f:
        f.write(line + "\n")


def dns_answer(q):
    qid, flags, qd = struct.unpack(">HHH", q[:6])
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
        i += 1 + q[i]
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    qend = i + 5
    name = ".".join(labels)
    log("dns", "%s %d" % (name, qtype))
    ans = b""
    rcode = 0
    if qtype == 1 and name in RECORDS:
        ans = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(RECORDS[name])
    elif qtype == 16 and name.endswith(".test"):
        txt = b"tunnel-reply"
        ans = b"\xc0\x0c" + struct.pack(">HHIH", 16, 1, 60, len(txt) + 1) + bytes([len(txt)]) + txt
    elif name not in RECORDS:
        rcode = 3
    hdr = struct.pack(">HHHHHH", qid, 0x8180 | rcode, 1, 1 if ans else 0, 0, 0)
    return hdr + q[12:qend] + ans


def dns_server(ip):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 53))
    while True:
        q, addr = s.recvfrom(4096)
        try:
            s.sendto(dns_answer(q), addr)
        except Exception as e:  # malformed: log and go on
            log("dns", "error %r" % e)


def udp_sink(ip):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((ip, 9999))
    while True:
        d, addr = s.recvfrom(4096)
        log("udp", "%s %s %r" % (ip, addr[0], d[:64]))


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        me = BY_IP.get(self.server.server_address[0], "?")
        scheme = "https" if self.server.tls else "http"
        log("http", "%s %s host=%s path=%s" % (scheme, me, self.headers.get("Host"), self.path))
        body = ("server=%s scheme=%s host=%s\n" % (me, scheme, self.headers.get("Host"))).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


HELD = []


def hold_server(ip):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((ip, 7000))
    s.listen(1024)
    while True:
        c, _ = s.accept()
        HELD.append(c)


def http_server(ip, port, tls):
    srv = ThreadingHTTPServer((ip, port), Handler)
    srv.tls = tls
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(os.path.join(DIR, "server.pem"), os.path.join(DIR, "server.key"))
        srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()


threads = [threading.Thread(target=dns_server, args=(RECORDS["ns.test"],), daemon=True)]
for ip in sorted(set(RECORDS.values())):
    threads.append(threading.Thread(target=udp_sink, args=(ip,), daemon=True))
    threads.append(threading.Thread(target=hold_server, args=(ip,), daemon=True))
    for port, tls in ((80, False), (443, True)):
        threads.append(threading.Thread(target=http_server, args=(ip, port, tls), daemon=True))
for t in threads:
    t.start()
with open(os.path.join(DIR, "ready"), "w") as f:
    f.write("ok\n")
threading.Event().wait()
