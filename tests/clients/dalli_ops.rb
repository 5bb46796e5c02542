# Runs a fixed script of memcache operations through Dalli (Debian's ruby-dalli 3.0.6, which
# speaks only the binary protocol) against HOST:PORT and prints one normalised line per
# operation: "PASS name: got" or "FAIL name: got (want: expected)". The expectations are
# memcached 1.6.18's answers.
require 'dalli'
require 'logger'

addr = ARGV.fetch(0)
Dalli.logger = Logger.new($stderr)
Dalli.logger.level = Logger::ERROR
$stdout.sync = true

dc = Dalli::Client.new(addr,
                       socket_timeout: 1, socket_max_failures: 1, socket_failure_delay: 0,
                       down_retry_delay: 0, compress: false, value_max_bytes: 4 * 1024 * 1024)
raw = { raw: true }
$failed = 0

# The result of one operation as a stable string: errors by class, addresses removed.
def norm(value)
  case value
  when Hash then '{' + value.sort.map { |k, v| "#{k}=#{norm(v)}" }.join(', ') + '}'
  when Array then '[' + value.map { |v| norm(v) }.join(', ') + ']'
  else value.inspect
  end
end

def op(name, want)
  got = begin
    norm(yield)
  rescue StandardError => e
    "err:#{e.class}"
  end
  if got == want
    puts "PASS #{name}: #{got}"
  else
    $failed += 1
    puts "FAIL #{name}: #{got} (want: #{want})"
  end
end

def cas_token?(cas)
  cas.is_a?(Integer) && cas.positive?
end

# A value no compressor shortens, by length and checksum instead of printed.
def pattern(len)
  Random.new(7).bytes(len)
end

def digest(value)
  value.nil? ? 'nil' : "len=#{value.bytesize} sum=#{value.sum(32)}"
end

op('version', '"<version>"') { dc.version.values.map { |v| v.to_s =~ /\A\d+\.\d+\.\d+/ ? '<version>' : v }.first }
op('alive', 'true') { dc.alive! && true }
op('flush', '[true]') { dc.flush }
op('get missing', 'nil') { dc.get('dl:missing') }
op('set', 'true') { cas_token?(dc.set('dl:a', 'alpha')) }
op('get', '"alpha"') { dc.get('dl:a') }
op('set object', 'true') { cas_token?(dc.set('dl:obj', { 'n' => [1, 2, 3] })) }
op('get object', '{n=[1, 2, 3]}') { dc.get('dl:obj') }
op('set raw', 'true') { cas_token?(dc.set('dl:raw', 'base', nil, raw)) }
op('get raw', '"base"') { dc.get('dl:raw', raw) }
op('add existing', 'false') { dc.add('dl:a', 'x') }
op('add new', 'true') { cas_token?(dc.add('dl:b', 'bee')) }
op('get added', '"bee"') { dc.get('dl:b') }
op('replace missing', '0') { dc.replace('dl:missing', 'x') }
op('replace existing', 'true') { cas_token?(dc.replace('dl:b', 'bee2')) }
op('get replaced', '"bee2"') { dc.get('dl:b') }
op('append', 'true') { dc.append('dl:raw', '-tail') }
op('prepend', 'true') { dc.prepend('dl:raw', 'head-') }
op('get appended', '"head-base-tail"') { dc.get('dl:raw', raw) }
op('append missing', 'false') { dc.append('dl:missing', 'x') }
op('prepend missing', 'false') { dc.prepend('dl:missing', 'x') }
op('delete', 'true') { dc.delete('dl:b') }
op('delete missing', 'nil') { dc.delete('dl:b') }
op('get deleted', 'nil') { dc.get('dl:b') }

# Multi-get (GETKQ... NOOP) and quiet pipelined writes inside multi { }.
op('multi quiet set/add/replace/delete', 'nil') do
  dc.multi do
    dc.set('dl:m1', 'one')
    dc.set('dl:m2', 'two')
    dc.set('dl:m3', 'three')
    dc.add('dl:m1', 'not-added')
    dc.replace('dl:m3', 'three-replaced')
    dc.replace('dl:missing', 'not-replaced')
    dc.delete('dl:m2')
    dc.delete('dl:missing')
  end
  nil
end
op('get_multi', '{dl:m1="one", dl:m3="three-replaced"}') { dc.get_multi('dl:m1', 'dl:m2', 'dl:m3', 'dl:missing') }
op('get_multi all missing', '{}') { dc.get_multi('dl:x1', 'dl:x2') }
op('get_multi many keys', '100') do
  dc.multi { 100.times { |i| dc.set("dl:many#{i}", i.to_s * 10, nil, raw) } }
  dc.get_multi((0...100).map { |i| "dl:many#{i}" }).size
end
op('get after multi', '"one"') { dc.get('dl:m1') }

# CAS.
op('get_cas', '["one", true]') { v, c = dc.get_cas('dl:m1'); [v, cas_token?(c)] }
op('get_cas missing', '[nil, false]') { v, c = dc.get_cas('dl:missing'); [v, cas_token?(c)] }
op('set_cas with token', 'true') { _, c = dc.get_cas('dl:m1'); cas_token?(dc.set_cas('dl:m1', 'one-cas', c)) }
op('set_cas stale token', 'false') do
  _, c = dc.get_cas('dl:m1')
  dc.set('dl:m1', 'changed')
  dc.set_cas('dl:m1', 'stale', c)
end
op('get after stale cas', '"changed"') { dc.get('dl:m1') }
op('cas block', 'true') { cas_token?(dc.cas('dl:m1') { |v| v + '+block' }) }
op('get after cas block', '"changed+block"') { dc.get('dl:m1') }
op('cas block missing', 'nil') { dc.cas('dl:missing') { |v| v.to_s + 'x' } }
op('cas! block missing', 'true') { cas_token?(dc.cas!('dl:casbang') { |v| "#{v.inspect}-new" }) }
op('get after cas!', '"nil-new"') { dc.get('dl:casbang') }
op('replace_cas', 'true') { _, c = dc.get_cas('dl:casbang'); cas_token?(dc.replace_cas('dl:casbang', 'r', c)) }
op('delete_cas stale', 'false') { dc.delete_cas('dl:casbang', 1) }
op('delete_cas with token', 'true') { _, c = dc.get_cas('dl:casbang'); dc.delete_cas('dl:casbang', c) }

# Counters, with and without a default (initial value) and a TTL for a created counter.
op('incr missing without default', 'nil') { dc.incr('dl:n') }
op('incr missing with default', '10') { dc.incr('dl:n', 1, nil, 10) }
op('incr', '15') { dc.incr('dl:n', 5) }
op('decr', '12') { dc.decr('dl:n', 3) }
op('decr below zero', '0') { dc.decr('dl:n', 100) }
op('get counter raw', '"0 "') { dc.get('dl:n', raw) }
op('decr missing with default', '3') { dc.decr('dl:down', 1, nil, 3) }
op('incr big', '18446744073709551615') { dc.set('dl:big', '18446744073709551614', nil, raw); dc.incr('dl:big', 1) }
op('incr wraps', '0') { dc.incr('dl:big', 1) }
op('incr non-numeric', 'err:Dalli::DalliError') { dc.incr('dl:a', 1) }
op('incr default with ttl 1', '100') { dc.incr('dl:ttlcounter', 1, 1, 100) }

# Large values: just under the 1 MiB item limit, and over it (refused by the server).
large = pattern(1_000_000)
op('set ~1MB', 'true') { cas_token?(dc.set('dl:large', large, nil, raw)) }
op('get ~1MB', digest(large).inspect) { digest(dc.get('dl:large', raw)) }
op('set 2MiB too large', 'err:Dalli::DalliError') { dc.set('dl:huge', pattern(2 * 1024 * 1024), nil, raw) }
op('get after too large', 'nil') { dc.get('dl:huge') }

# Touch, get-and-touch and expiry (one 2 s wait for every short TTL).
op('touch', 'true') { dc.touch('dl:m1', 100) }
op('touch missing', 'nil') { dc.touch('dl:missing', 100) }
op('gat', '"changed+block"') { dc.gat('dl:m1', 100) }
op('gat missing', 'nil') { dc.gat('dl:missing', 100) }
op('set ttl 1', 'true') { cas_token?(dc.set('dl:ttl', 'short', 1)) }
op('set ttl 100', 'true') { cas_token?(dc.set('dl:long', 'long', 100)) }
op('touch to 1s', 'true') { dc.set('dl:touched', 't'); dc.touch('dl:touched', 1) }
op('gat to 1s', '"g"') { dc.set('dl:gat', 'g'); dc.gat('dl:gat', 1) }
# TTL 1 may lapse at the server's next clock tick, even right away; TTL 2 lives past 1 s.
op('get ttl 2 right away', '"two"') { dc.set('dl:ttl2', 'two', 2); dc.get('dl:ttl2') }
sleep 2.0
op('get expired', 'nil') { dc.get('dl:ttl') }
op('get touched expired', 'nil') { dc.get('dl:touched') }
op('get gat expired', 'nil') { dc.get('dl:gat') }
op('incr created counter expired', 'nil') { dc.incr('dl:ttlcounter', 1) }
op('get not expired', '"long"') { dc.get('dl:long') }

op('stats', '[true, true, true]') do
  s = dc.stats.values.first
  [s.key?('pid'), s.key?('curr_items'), s.key?('version')]
end
op('stats items', 'true') { dc.stats(:items).values.first.is_a?(Hash) }
op('reset_stats', '[true]') { dc.reset_stats }
op('flush all', '[true]') { dc.flush }
op('get after flush', 'nil') { dc.get('dl:long') }
exit($failed.zero? ? 0 : 1)
