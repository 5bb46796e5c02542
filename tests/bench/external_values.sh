#!/bin/bash
# Hand-run benchmark (docs/BENCHMARKS.md, "External values"); BIN/LOAD from target/release
# (cargo build --release -p ringstore -p ringstore-bench).
# memcache GET of 100 KiB values, 1000 keys (100 MB), 8 connections, 5 s, server on CPU 0,
# load generator on CPU 1: ringstore --data on tmpfs with external values (default 64KiB),
# with them off (--external-value-min 0: values in RAM), and memcached 1.6 (-m 1024 -I 1m).
BIN=${BIN:-$(dirname "$0")/../../target/release/ringstore}
LOAD=${LOAD:-"$(dirname "$0")/../../target/release/ringstore-bench load"}
args="--mode long --conns 8 --threads 1 --secs 5 --keys 1000 --value-size 102400 --set-every 1000000000"
run() { # name, port
  sleep 1
  r=$(taskset -c 1 $LOAD --addr 127.0.0.1:$2 $args)
  echo "$1: $r"
}
for rep in 1 2; do
rm -f /dev/shm/eb.img; truncate -s 2G /dev/shm/eb.img
taskset -c 0 $BIN serve --data /dev/shm/eb.img --cores 1 --memory 1024MiB --memcache 127.0.0.1:21411 --http off >/dev/null 2>&1 & P=$!
run "ringstore external (stub in RAM, value read from the device)" 21411
printf 'stats\r\nquit\r\n' | timeout 2 python3 -c "import socket,sys;s=socket.create_connection(('127.0.0.1',21411));s.sendall(b'stats\r\n');import time;time.sleep(0.3);d=s.recv(65536).decode();print([l for l in d.split('\r\n') if 'extstore' in l or 'curr_items' in l or l.startswith('STAT bytes ')])"
echo "  VmHWM $(grep VmHWM /proc/$P/status)"
kill $P; wait $P 2>/dev/null
rm -f /dev/shm/eb.img; truncate -s 2G /dev/shm/eb.img
taskset -c 0 $BIN serve --data /dev/shm/eb.img --cores 1 --memory 1024MiB --external-value-min 0 --memcache 127.0.0.1:21412 --http off >/dev/null 2>&1 & P=$!
run "ringstore values in RAM (--external-value-min 0)" 21412
echo "  VmHWM $(grep VmHWM /proc/$P/status)"
kill $P; wait $P 2>/dev/null
taskset -c 0 memcached -u root -U 0 -p 21413 -l 127.0.0.1 -m 1024 -I 1m -t 1 >/dev/null 2>&1 & P=$!
run "memcached 1.6 -t 1 (RAM)" 21413
echo "  VmHWM $(grep VmHWM /proc/$P/status)"
kill $P; wait $P 2>/dev/null
done
rm -f /dev/shm/eb.img
