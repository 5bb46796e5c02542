<?php
// Runs a fixed script of memcache operations through php-memcached (libmemcached) with
// Memcached::OPT_BINARY_PROTOCOL on against HOST:PORT and prints one normalised line per
// operation: "PASS name: got" or "FAIL name: got (want: expected)". The expectations are
// memcached 1.6.18's answers. A false/null result carries libmemcached's result code.

[$host, $port] = explode(':', $argv[1]);
$m = new Memcached();
$m->setOption(Memcached::OPT_BINARY_PROTOCOL, true);
$m->setOption(Memcached::OPT_COMPRESSION, false);
$m->setOption(Memcached::OPT_CONNECT_TIMEOUT, 1000);
$m->setOption(Memcached::OPT_POLL_TIMEOUT, 1000);
$m->setOption(Memcached::OPT_RECV_TIMEOUT, 1000000);
$m->setOption(Memcached::OPT_SEND_TIMEOUT, 1000000);
$m->setOption(Memcached::OPT_RETRY_TIMEOUT, 0);
$m->addServer($host, (int)$port);
$failed = 0;

// Result-code numbers by name, for a readable line.
$codes = [];
foreach ((new ReflectionClass('Memcached'))->getConstants() as $name => $value) {
    if (str_starts_with($name, 'RES_') && !isset($codes[$value])) {
        $codes[$value] = $name;
    }
}

function norm($v)
{
    if (is_array($v)) {
        ksort($v);
        $parts = [];
        foreach ($v as $k => $x) {
            $parts[] = var_export($k, true) . '=>' . norm($x);
        }
        return '[' . implode(', ', $parts) . ']';
    }
    return var_export($v, true);
}

function op($name, $want, $fn)
{
    global $m, $failed, $codes;
    try {
        $v = $fn();
        $got = norm($v);
        if ($v === false || $v === null) {
            $got .= '/' . ($codes[$m->getResultCode()] ?? $m->getResultCode());
        }
    } catch (Throwable $e) {
        $got = 'err:' . get_class($e);
    }
    if ($got === $want) {
        echo "PASS $name: $got\n";
    } else {
        $failed++;
        echo "FAIL $name: $got (want: $want)\n";
    }
}

function pattern($n)
{
    mt_srand(7);
    $s = '';
    while (strlen($s) < $n) {
        $s .= pack('N', mt_rand());
    }
    return substr($s, 0, $n);
}

function digest($v)
{
    return is_string($v) ? 'len=' . strlen($v) . ' crc=' . hash('crc32b', $v) : $v;
}

function cas_of($key)
{
    global $m;
    $r = $m->get($key, null, Memcached::GET_EXTENDED);
    return is_array($r) ? $r['cas'] : 0;
}

op('version', "true", fn() => (bool)preg_match('/^\d+\.\d+\.\d+/', array_values($m->getVersion())[0]));
op('flush', 'true', fn() => $m->flush());
op('stats', "[0=>true, 1=>true, 2=>true]", fn() => (function ($s) {
    return [isset($s['pid']), isset($s['curr_items']), isset($s['version'])];
})(array_values($m->getStats())[0]));
op('get missing', "false/RES_NOTFOUND", fn() => $m->get('ph:missing'));
op('set', 'true', fn() => $m->set('ph:a', 'alpha'));
op('get', "'alpha'", fn() => $m->get('ph:a'));
op('set int', 'true', fn() => $m->set('ph:i', 42));
op('get int', '42', fn() => $m->get('ph:i'));
op('set array', 'true', fn() => $m->set('ph:arr', ['n' => [1, 2, 3]]));
op('get array', "['n'=>[0=>1, 1=>2, 2=>3]]", fn() => $m->get('ph:arr'));
op('add existing', "false/RES_DATA_EXISTS", fn() => $m->add('ph:a', 'x'));
op('add new', 'true', fn() => $m->add('ph:b', 'bee'));
op('replace missing', "false/RES_NOTFOUND", fn() => $m->replace('ph:missing', 'x'));
op('replace existing', 'true', fn() => $m->replace('ph:b', 'bee2'));
op('get replaced', "'bee2'", fn() => $m->get('ph:b'));
op('append', 'true', fn() => $m->append('ph:a', '-tail'));
op('prepend', 'true', fn() => $m->prepend('ph:a', 'head-'));
op('get appended', "'head-alpha-tail'", fn() => $m->get('ph:a'));
op('append missing', "false/RES_NOTSTORED", fn() => $m->append('ph:missing', 'x'));
op('prepend missing', "false/RES_NOTSTORED", fn() => $m->prepend('ph:missing', 'x'));
op('delete', 'true', fn() => $m->delete('ph:b'));
op('delete missing', "false/RES_NOTFOUND", fn() => $m->delete('ph:b'));
op('get deleted', "false/RES_NOTFOUND", fn() => $m->get('ph:b'));

// Multi operations.
op('setMulti', 'true', fn() => $m->setMulti(['ph:m1' => 'one', 'ph:m2' => 'two', 'ph:m3' => 'three']));
op('getMulti', "['ph:m1'=>'one', 'ph:m3'=>'three']", fn() => $m->getMulti(['ph:m1', 'ph:missing', 'ph:m3']));
op('getMulti all missing', '[]', fn() => $m->getMulti(['ph:x1', 'ph:x2']));
op('getMulti extended', "['ph:m1'=>['cas'=>true, 'flags'=>0, 'value'=>'one']]", fn() => (function ($r) {
    if (!is_array($r)) {
        return $r;
    }
    foreach ($r as $k => $x) {
        $r[$k]['cas'] = $x['cas'] > 0;
    }
    return $r;
})($m->getMulti(['ph:m1'], Memcached::GET_EXTENDED)));
op('deleteMulti', "['ph:m3'=>true, 'ph:missing'=>16]", fn() => $m->deleteMulti(['ph:m3', 'ph:missing']));
op('getMulti 200 keys', '200', function () use ($m) {
    $items = [];
    for ($i = 0; $i < 200; $i++) {
        $items["ph:many$i"] = str_repeat((string)$i, 10);
    }
    $m->setMulti($items);
    return count($m->getMulti(array_keys($items)));
});
op('getDelayed + fetchAll', "[0=>['cas'=>true, 'key'=>'ph:m1', 'value'=>'one'], 1=>['cas'=>true, 'key'=>'ph:m2', 'value'=>'two']]", function () use ($m) {
    $m->getDelayed(['ph:m1', 'ph:m2', 'ph:missing']);
    $r = array_map(fn($x) => ['key' => $x['key'], 'value' => $x['value'], 'cas' => $x['cas'] > 0], $m->fetchAll());
    usort($r, fn($a, $b) => strcmp($a['key'], $b['key']));
    return $r;
});

// CAS.
op('get extended', "[0=>'one', 1=>true]", fn() => (function ($r) {
    return [$r['value'], $r['cas'] > 0];
})($m->get('ph:m1', null, Memcached::GET_EXTENDED)));
op('cas with token', 'true', fn() => $m->cas(cas_of('ph:m1'), 'ph:m1', 'one-cas'));
op('get after cas', "'one-cas'", fn() => $m->get('ph:m1'));
op('cas stale token', "false/RES_DATA_EXISTS", function () use ($m) {
    $t = cas_of('ph:m1');
    $m->set('ph:m1', 'changed');
    return $m->cas($t, 'ph:m1', 'stale');
});
op('get after stale cas', "'changed'", fn() => $m->get('ph:m1'));
op('cas missing key', "false/RES_NOTFOUND", fn() => $m->cas(12345, 'ph:missing', 'x'));

// Counters; the initial value and its expiry exist only in the binary protocol.
op('increment missing', "false/RES_NOTFOUND", fn() => $m->increment('ph:n'));
op('increment with initial value', '10', fn() => $m->increment('ph:n', 1, 10));
op('increment', '15', fn() => $m->increment('ph:n', 5));
op('decrement', '12', fn() => $m->decrement('ph:n', 3));
op('decrement below zero', '0', fn() => $m->decrement('ph:n', 100));
op('get counter', "'0 '", fn() => $m->get('ph:n'));
op('decrement with initial value', '7', fn() => $m->decrement('ph:down', 1, 7));
op('increment non-numeric', "false/RES_UNKNOWN_READ_FAILURE", fn() => $m->increment('ph:a', 1));
op('increment initial with expiry 1', '100', fn() => $m->increment('ph:ttlcounter', 1, 100, 1));
op('incrementByKey', '3', fn() => $m->incrementByKey('any', 'ph:n', 3));

// Large values: just under the 1 MiB item limit, and over it (refused by the server).
$large = pattern(1000000);
op('set ~1MB', 'true', fn() => $m->set('ph:large', $large));
op('get ~1MB', var_export(digest($large), true), fn() => digest($m->get('ph:large')));
op('set 2MiB too large', "false/RES_E2BIG", fn() => $m->set('ph:huge', pattern(2 << 20)));
op('get after too large', "false/RES_NOTFOUND", fn() => $m->get('ph:huge'));
op('connection fine after too large', "'two'", fn() => $m->get('ph:m2'));

// Touch and expiry (one 2 s wait for every short TTL).
op('touch', 'true', fn() => $m->touch('ph:m2', 100));
op('touch missing', "false/RES_NOTFOUND", fn() => $m->touch('ph:missing', 100));
op('set ttl 1', 'true', fn() => $m->set('ph:ttl', 'short', 1));
op('set ttl 100', 'true', fn() => $m->set('ph:long', 'long', 100));
op('setMulti ttl 1', 'true', fn() => $m->setMulti(['ph:t1' => '1', 'ph:t2' => '2'], 1));
op('touch to 1s', 'true', fn() => $m->set('ph:touched', 't') && $m->touch('ph:touched', 1));
// TTL 1 may lapse at the server's next clock tick, even right away; TTL 2 lives past 1 s.
op('get ttl 2 right away', "'two'", fn() => $m->set('ph:ttl2', 'two', 2) ? $m->get('ph:ttl2') : false);
usleep(2000000);
op('get expired', "false/RES_NOTFOUND", fn() => $m->get('ph:ttl'));
op('getMulti expired', '[]', fn() => $m->getMulti(['ph:t1', 'ph:t2']));
op('get touched expired', "false/RES_NOTFOUND", fn() => $m->get('ph:touched'));
op('increment created counter expired', "false/RES_NOTFOUND", fn() => $m->increment('ph:ttlcounter'));
op('get not expired', "'long'", fn() => $m->get('ph:long'));

op('flush at the end', 'true', fn() => $m->flush());
op('get after flush', "false/RES_NOTFOUND", fn() => $m->get('ph:long'));
exit($failed ? 1 : 0);
