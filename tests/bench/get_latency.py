"""Hand-run benchmark helper (docs/BENCHMARKS.md): one memcache connection sets 100 values of 100 KiB, then times 2000 GETs. Usage: get_latency.py PORT."""
import socket, time, sys
port=int(sys.argv[1])
s=socket.create_connection(('127.0.0.1',port)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
v=b'v'*102400
for k in range(100):
    s.sendall(b'set key:%d 0 0 %d\r\n%s\r\n'%(k,len(v),v)); buf=b''
    while not buf.endswith(b'\r\n'): buf+=s.recv(100)
def get(k):
    s.sendall(b'get key:%d\r\n'%k); buf=bytearray()
    while not buf.endswith(b'END\r\n'): buf+=s.recv(1<<20)
    return len(buf)
t=time.perf_counter(); n=2000
for i in range(n): get(i%100)
print('per get us', (time.perf_counter()-t)/n*1e6)
