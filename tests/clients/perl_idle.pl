#!/usr/bin/perl
# Idle connections (issue 25): the two Perl clients store a value, keep their connection
# idle for SLEEP seconds and read the value back on it. memcached never closes an idle
# connection; a server that does makes Cache::Memcached::Fast return an error (no retry)
# and Cache::Memcached a false miss. Prints one line per client: `PASS name` or
# `FAIL name: what it got`. Usage: perl_idle.pl HOST:PORT SLEEP
use strict;
use warnings;
use Cache::Memcached;
use Cache::Memcached::Fast;

my ($server, $sleep) = @ARGV;
die "usage: $0 HOST:PORT SLEEP\n" unless defined $sleep;

my %clients = (
    fast => Cache::Memcached::Fast->new({ servers => [$server], io_timeout => 5 }),
    classic => Cache::Memcached->new({ servers => [$server] }),
);
for my $name (sort keys %clients) {
    my $ok = $clients{$name}->set("idle-$name", "value-$name");
    print "FAIL $name: set returned false\n" unless $ok;
}
$| = 1;
print "STORED\n";
sleep $sleep;
for my $name (sort keys %clients) {
    my $got = $clients{$name}->get("idle-$name");
    if (defined $got && $got eq "value-$name") {
        print "PASS $name\n";
    } else {
        print "FAIL $name: " . (defined $got ? "'$got'" : "undef") . "\n";
    }
}
