#!/usr/bin/env python3
"""Exhaustive state-space search of the core of design.md 3g (third draft), one org.

Actors: holder H (window W, run R then its continued run R2), claimant C (K1 with
placement P, forced: it does not judge H's lease), retention (per-batch rule), and H's
one checkpoint of `o`. H keeps committing and issuing while C claims, so H is both the
live holder and, once fenced, the zombie.

Checked property (I6/I7): once C serves with hydrated version h, H has never acknowledged
and never acknowledges a version above h. (An ack H made of a state C does not hold is
either lost or a second writer's.)

Variants (command line): seal=failed|lowest   plist=fresh|walk   late=0|1
  seal=failed   draft P: the self-seal goes at the failed slot itself, at once; once it
                lands every org goes on in R2 (J3).
  seal=lowest   J3-2's fix: wait until nothing is in flight in the run, then seal at the
                lowest unresolved slot, moving up past own late landings; an exclusion
                met there fences o.
  plist=fresh   draft P read literally: P lists the end run afresh, takes f and the lowest
                free slot; the second listing checks only that [f, fence] is occupied
                (a hole gets a second fence).
  plist=walk    J3-4's fix: P uses the walk's listing; the second listing re-runs the walk
                and C serves only if it ends at C's own fence.
  late=1        a failed put may still land later (2a's StoreRefused), unknown to H.
"""
import sys
from collections import deque

W = 2           # ship window
NR = 4          # slots of run R
NR2 = 2         # slots of run R2
MAXFAIL = 2     # failed puts in one run of the search
MAXTRY = 2      # claim attempts by C

args = dict(a.split('=') for a in sys.argv[1:])
SEAL = args.get('seal', 'failed')
PLIST = args.get('plist', 'fresh')
LATE = args.get('late', '0') == '1'
RETAIN = args.get('retain', '1') in ('1', 'nofloor')
RETAIN_NOFLOOR = args.get('retain', '1') == 'nofloor'   # mutation: drop the floor condition

NSLOTS = {'R': NR, 'R2': NR2}

# store: frozenset of ((run, slot), obj); obj = ('B', ver, floor) | ('SS', floor) | ('X', floor)
# H: dict-like tuple fields (see mk_h)
# C: (phase, tries, f, fence_run, fence_slot, listing, hydrated)


def sget(store, key):
    for k, v in store:
        if k == key:
            return v
    return None


def sput(store, key, obj):
    return store | {(key, obj)}


def sdel(store, key):
    return frozenset(x for x in store if x[0] != key)


def objs_in(store, run):
    return sorted((k[1], v) for k, v in store if k[0] == run)


def walk(store, cp):
    """K0 over one listing. Returns (end, run, entry, hydrated, fence_hit):
    end = 'C' when the walk met C's exclusion, else the run it ends in."""
    run = 'R'
    entry = cp[0] + 1 if cp else 1
    h = cp[1] if cp else 0
    while True:
        for slot, o in objs_in(store, run):
            if slot < entry:
                continue
            if o[0] == 'B':
                h = max(h, o[1])
            elif o[0] == 'SS':
                run, entry = 'R2', 1
                break
            elif o[0] == 'X':
                return ('C', run, entry, h, slot)
        else:
            return (run, run, entry, h, None)


def floor_of(H, run):
    res, nxt = H['res'], H['next']
    for s in range(1, nxt):
        if res.get((run, s)) not in ('ours', 'X'):
            return s
    return nxt


def prefix_max(H, run):
    res, sent = H['res'], H['sent']
    s, m = 1, 0
    while res.get((run, s)) == 'ours':
        m = max(m, sent[(run, s)])
        s += 1
    return m


def freeze(H):
    return tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else
                         (tuple(sorted(v)) if isinstance(v, (set, frozenset)) else v))
                        for k, v in H.items()))


def thaw(t):
    H = {}
    for k, v in t:
        if k in ('res', 'sent'):
            H[k] = dict(v)
        elif k in ('inflight', 'lostput'):
            H[k] = frozenset(v)
        else:
            H[k] = v
    return H


def recompute_acks(H):
    if H['fenced']:
        return
    m = prefix_max(H, 'R')
    if H['run'] == 'R2':
        m = max(m, prefix_max(H, 'R2'))
    H['acked'] = max(H['acked'], m)


def h_moves(state):
    store, Ht, C, cp, fails = state
    H = thaw(Ht)
    out = []
    if H['fenced']:
        # a fenced writer still has creates in flight; their outcomes change the store
        pass
    run = H['run']
    # issue
    blocked = run == 'R' and any(x == 'fail' for (rr, _), x in H['res'].items() if rr == 'R')
    if not H['fenced'] and not blocked and run in NSLOTS:
        nxt = H['next']
        fl = floor_of(H, run)
        if nxt <= NSLOTS[run] and nxt < fl + W:
            H2 = thaw(Ht)
            v = H2['ver'] + 1
            H2['ver'] = v
            H2['sent'][(run, nxt)] = v
            H2['inflight'] = H2['inflight'] | {(run, nxt, v, fl)}
            H2['next'] = nxt + 1
            out.append(('H issue %s/%d v%d' % (run, nxt, v), (store, freeze(H2), C, cp, fails)))
    # outcomes of creates in flight
    for item in H['inflight']:
        r, s, v, fl = item
        # lands (or collides)
        H2 = thaw(Ht)
        H2['inflight'] = H2['inflight'] - {item}
        o = sget(store, (r, s))
        st2 = store
        if o is None:
            st2 = sput(store, (r, s), ('B', v, fl))
            H2['res'][(r, s)] = 'ours'
            label = 'H lands %s/%d' % (r, s)
        else:
            if o[0] == 'X':
                H2['res'][(r, s)] = 'X'
                H2['fenced'] = True
            else:
                H2['res'][(r, s)] = 'other'
            label = 'H collides %s/%d with %s' % (r, s, o[0])
        recompute_acks(H2)
        out.append((label, (st2, freeze(H2), C, cp, fails)))
        # fails (absent on re-read)
        if fails < MAXFAIL:
            H2 = thaw(Ht)
            H2['inflight'] = H2['inflight'] - {item}
            H2['res'][(r, s)] = 'fail'
            if LATE:
                H2['lostput'] = H2['lostput'] | {(r, s, v, fl)}
            out.append(('H put fails %s/%d' % (r, s), (store, freeze(H2), C, cp, fails + 1)))
    # a failed put lands late (unknown to H)
    for item in H['lostput']:
        r, s, v, fl = item
        H2 = thaw(Ht)
        H2['lostput'] = H2['lostput'] - {item}
        st2 = store if sget(store, (r, s)) is not None else sput(store, (r, s), ('B', v, fl))
        out.append(('late landing %s/%d' % (r, s), (st2, freeze(H2), C, cp, fails)))
    # self-seal
    if not H['fenced'] and H['seal'] is None and run == 'R':
        failed = sorted(s for (rr, s), x in H['res'].items() if rr == 'R' and x == 'fail')
        if failed:
            if SEAL == 'failed':
                target = failed[0]
                ok = True
            else:
                inflight_here = [i for i in H['inflight'] if i[0] == 'R']
                ok = not inflight_here
                target = floor_of(H, 'R')
            if ok:
                H2 = thaw(Ht)
                o = sget(store, ('R', target))
                st2 = store
                if o is None:
                    st2 = sput(store, ('R', target), ('SS', floor_of(H, 'R')))
                    H2['res'][('R', target)] = 'SS'
                    H2['seal'] = target
                    H2['run'], H2['next'] = 'R2', 1
                    label = 'H self-seal lands R/%d -> R2' % target
                elif o[0] == 'X':
                    H2['res'][('R', target)] = 'X'
                    H2['fenced'] = True
                    label = 'H self-seal collides with X at R/%d: fenced' % target
                elif o[0] == 'B':
                    # our own late landing: resolved as ours, move up next time
                    H2['res'][('R', target)] = 'ours'
                    H2['lostput'] = frozenset(i for i in H2['lostput'] if i[:2] != ('R', target))
                    label = 'H self-seal collides with own late batch R/%d' % target
                else:
                    label = 'H self-seal collides with %s' % (o,)
                recompute_acks(H2)
                out.append((label, (st2, freeze(H2), C, cp, fails)))
    # checkpoint of o (once, through the end of R's prefix)
    if not H['fenced'] and cp is None:
        s = 0
        while H['res'].get(('R', s + 1)) == 'ours':
            s += 1
        if s >= 1:
            out.append(('H checkpoint through R/%d' % s, (store, Ht, C, (s, H['sent'][('R', s)]), fails)))
    return out


def highest_floor(store, run):
    objs = objs_in(store, run)
    if not objs:
        return 1
    return max(o[-1] for _, o in objs)


def lowest_free(store, run, f):
    s = f
    while sget(store, (run, s)) is not None:
        s += 1
    return s


def c_moves(state):
    store, Ht, C, cp, fails = state
    phase, tries, f, frun, fslot, listing, hyd = C
    out = []
    if phase == 'idle' and tries < MAXTRY:
        end = walk(store, cp)
        if end[0] != 'C':
            out.append(('C walks: ends in %s' % end[0],
                        (store, Ht, ('walked', tries + 1, 0, end[1], 0, store, 0), cp, fails)))
    elif phase == 'walked':
        L = store if PLIST == 'fresh' else listing
        run = frun
        f2 = highest_floor(L, run)
        slot = lowest_free(L, run, f2)
        if slot <= NSLOTS[run] + 1:
            o = sget(store, (run, slot))
            if o is None:
                st2 = sput(store, (run, slot), ('X', f2))
                out.append(('C excludes at %s/%d (f=%d)' % (run, slot, f2),
                            (st2, Ht, ('placed', tries, f2, run, slot, listing, 0), cp, fails)))
            else:
                out.append(('C exclusion collides at %s/%d with %s: re-walk' % (run, slot, o[0]),
                            (store, Ht, ('idle', tries, 0, '', 0, frozenset(), 0), cp, fails)))
    elif phase == 'placed':
        L3 = store
        if PLIST == 'fresh':
            holes = [s for s in range(f, fslot) if sget(L3, (frun, s)) is None]
            if holes:
                s = holes[0]
                st2 = sput(store, (frun, s), ('X', f))
                out.append(('C second fence at %s/%d' % (frun, s),
                            (st2, Ht, ('placed', tries, f, frun, s, listing, 0), cp, fails)))
            else:
                h = walk(L3, cp)[3]
                out.append(('C serves, hydrated v%d' % h,
                            (store, Ht, ('served', tries, f, frun, fslot, frozenset(), h), cp, fails)))
        else:
            end = walk(L3, cp)
            full = all(sget(L3, (frun, s)) is not None for s in range(f, fslot))
            if end[0] == 'C' and end[1] == frun and end[4] == fslot and full:
                out.append(('C serves, hydrated v%d' % end[3],
                            (store, Ht, ('served', tries, f, frun, fslot, frozenset(), end[3]), cp, fails)))
            else:
                out.append(('C re-walk finds its fence void: claim again',
                            (store, Ht, ('idle', tries, 0, '', 0, frozenset(), 0), cp, fails)))
    return out


def r_moves(state):
    """Per-batch retention: a batch of R at or below the checkpoint's through (o's only
    section there, so o's walk starts past it), below the floor of R's highest object."""
    if not RETAIN:
        return []
    store, Ht, C, cp, fails = state
    out = []
    if cp is None:
        return out
    objs = objs_in(store, 'R')
    if not objs:
        return out
    top_floor = objs[-1][1][-1]
    for slot, o in objs:
        if o[0] == 'B' and slot <= cp[0] and (slot < top_floor or RETAIN_NOFLOOR):
            out.append(('R deletes R/%d' % slot, (sdel(store, ('R', slot)), Ht, C, cp, fails)))
    return out


def violated(state):
    store, Ht, C, cp, fails = state
    H = thaw(Ht)
    return C[0] == 'served' and H['acked'] > C[6]


def main():
    H0 = dict(run='R', next=1, ver=0, res={}, sent={}, inflight=frozenset(),
              lostput=frozenset(), seal=None, fenced=False, acked=0)
    C0 = ('idle', 0, 0, '', 0, frozenset(), 0)
    s0 = (frozenset(), freeze(H0), C0, None, 0)
    seen = {s0: None}
    q = deque([s0])
    n = 0
    while q:
        s = q.popleft()
        n += 1
        if violated(s):
            trace = []
            while s is not None:
                p = seen[s]
                if p is None:
                    break
                trace.append(p[1])
                s = p[0]
            trace.reverse()
            print('VIOLATION after %d states (seal=%s plist=%s late=%s):' % (n, SEAL, PLIST, LATE))
            for i, t in enumerate(trace, 1):
                print('  %2d. %s' % (i, t))
            return 1
        for label, t in h_moves(s) + c_moves(s) + r_moves(s):
            if t not in seen:
                seen[t] = (s, label)
                q.append(t)
    served = [x for x in seen if x[2][0] == 'served']
    r2acks = [x for x in served if thaw(x[1])['acked'] > 0 and thaw(x[1])['run'] == 'R2'
              and prefix_max(thaw(x[1]), 'R2') > 0]
    deleted = [x for x in seen if x[3] is not None and any(
        s <= x[3][0] and sget(x[0], ('R', s)) is None and ('R', s) in thaw(x[1])['res']
        and thaw(x[1])['res'][('R', s)] == 'ours' for s in range(1, NR + 1))]
    fenced = [x for x in seen if thaw(x[1])['fenced']]
    print('  reachable: C served in %d states; C served and H acked from R2 in %d; a batch '
          'deleted by retention in %d; H fenced in %d' % (len(served), len(r2acks), len(deleted), len(fenced)))
    print('no violation: %d states explored (seal=%s plist=%s late=%s retain=%s; W=%d, R %d slots, '
          'R2 %d slots, <=%d failed puts, <=%d claim attempts)' % (
              len(seen), SEAL, PLIST, LATE, RETAIN, W, NR, NR2, MAXFAIL, MAXTRY))
    return 0


if __name__ == '__main__':
    sys.exit(main())
