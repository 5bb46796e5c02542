#!/bin/bash
# Large objects side by side with nginx (docs/BENCHMARKS.md, "Large objects"): 1 GiB PUT and GET
# with curl, and 2000 random 64 KiB Range GETs over keep-alive (range_reads.py), ringstore
# --data on a tmpfs file vs nginx (sendfile) serving the same bytes from /dev/shm. Servers on
# CPU 0, clients on CPU 1. Needs nginx and curl; BIN defaults to target/release/ringstore.
set -e
BIN=${BIN:-$(dirname "$0")/../../target/release/ringstore}
HERE=$(cd "$(dirname "$0")" && pwd)
[ -f /dev/shm/obj1g ] || head -c 1G /dev/urandom > /dev/shm/obj1g
NGX=$(mktemp -d)
cat > $NGX/nginx.conf <<CONF
worker_processes 1;
daemon off;
error_log $NGX/error.log;
pid $NGX/nginx.pid;
events { worker_connections 64; }
http { access_log off; sendfile on; server { listen 127.0.0.1:28380; root /dev/shm; } }
CONF
taskset -c 0 nginx -c $NGX/nginx.conf & NP=$!
rm -f /dev/shm/lb.img; truncate -s 4G /dev/shm/lb.img
taskset -c 0 $BIN serve --data /dev/shm/lb.img --cores 1 --memory 64MiB --memcache off --http 127.0.0.1:28180 >/dev/null 2>&1 & RP=$!
sleep 1
for k in 1 2; do echo "PUT 1 GiB: $(taskset -c 1 curl -s -o /dev/null -w '%{http_code} %{time_total} s' -T /dev/shm/obj1g http://127.0.0.1:28180/obj$k)"; done
for rep in 1 2 3; do
  r=$(taskset -c 1 curl -s -o /dev/null -w '%{http_code} %{time_total} s' http://127.0.0.1:28180/obj1)
  n=$(taskset -c 1 curl -s -o /dev/null -w '%{http_code} %{time_total} s' http://127.0.0.1:28380/obj1g)
  echo "GET 1 GiB: ringstore $r, nginx $n"
done
for rep in 1 2 3; do
  echo "64 KiB ranges: ringstore $(taskset -c 1 python3 $HERE/range_reads.py 28180 /obj1), nginx $(taskset -c 1 python3 $HERE/range_reads.py 28380 /obj1g)"
done
echo "ringstore $(grep VmHWM /proc/$RP/status)"
kill $RP $NP; wait 2>/dev/null || true
rm -rf /dev/shm/lb.img $NGX
