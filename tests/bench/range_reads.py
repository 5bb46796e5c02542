"""Hand-run benchmark helper (docs/BENCHMARKS.md): 2000 random 64 KiB Range GETs of a 1 GiB object over one keep-alive connection; prints microseconds per request. Usage: range_reads.py PORT PATH."""
import http.client, time, sys
port, path = int(sys.argv[1]), sys.argv[2]
c = http.client.HTTPConnection('127.0.0.1', port, timeout=30)
n = 2000
t = time.perf_counter()
for i in range(n):
    off = (i * 5000011) % 1000000000
    c.request('GET', path, headers={'Range': 'bytes=%d-%d' % (off, off + 65535)})
    r = c.getresponse(); b = r.read()
    assert r.status == 206 and len(b) == 65536
print('%.0f us/req' % ((time.perf_counter() - t) / n * 1e6))
