#!/usr/bin/env python3
"""Exhaustive state search of design.md 3g, fifth draft: the journal with two orgs.

Run `python3 model.py` for the default scenarios under the fifth draft's rules (DEFAULT_RUNS,
about 13 minutes on one core), `python3 model.py mutations` for the mutations that must fail
(MUTATIONS), or one run with `python3 model.py scenario=NAME [OPTION=VALUE ...]`, options as in
DEFAULTS plus maxfail=N and maxtry=N. Progress (BFS depth, states) goes to stderr every 30 s.

Writers (processes) each own runs; a run is a create-only sequence of slots. Objects:
  ('B', floor, sects, retain_below)      batch; sects = ((org, round, hist), ...)
                                         (scenario j61's preset roster has a fifth field,
                                         its `claims` list ((org, run, from), ...), J6-1)
  ('SS', floor, cont)                    self-seal, continued run (entered at slot 1)
  ('AS', floor, cont, frm)               adopt seal, adopter's run entered at frm, round + 1
  ('RS', floor)                          release seal: a free point
  ('X', floor, org, round, run, frm, by) exclusion; floor is the f it was placed by, run and
                                         frm its claim's (xrun=claim)
Org logs hold ('CL', round, run, frm, after, by) claims and ('CP', round, run, through, hist)
checkpoints. A hist is the tuple of commit ids a state holds; a tenure is (org, round).

Checked at every state (I2/I6/I7, with I8's hydrate): for each org, no two serving tenures share
a round, and every history a tenure acknowledged (ever) is a prefix of the history every
serving tenure of a higher round hydrated. An ack that is not in a later tenure's hydrate is
either lost or a second writer's.
"""
import sys
import time
from collections import deque

ORGS = ('o', 'p')
W = 2            # window of every writer
NSLOT = {'H1': 3, 'H2': 2}    # slots per run (others: DEFAULT_SLOTS)
DEFAULT_SLOTS = 1

ARGS = {}

# The fifth draft's rules are the defaults; each other value is a mutation that must fail.
DEFAULTS = dict(
    retain='below',   # T3: below min(retain_below of the highest batch, highest floor), computed
                      # by the run's writer; 'prefix' is an oracle (every org's actual walk),
                      # 'batch' and 'wholerun' the third draft's rules, 'none' no retention
    rb='claims',      # retain_below counts every claim the writer created naming the run (J4-2);
                      # 'held': only the orgs it holds (the fourth draft)
    frm='floor',      # a claim's, exclusion's, adopt seal's `from` is the writer's floor (J4-1);
                      # 'next': its next unissued slot (the fourth draft)
    follow='1',       # after a self-seal the writer's entries follow it: a claim naming an
                      # earlier run enters the continued run at 1 (retain_below, the tenure's
                      # entry); '0': dropped at the seal
    j2start='1',      # J2 judges exclusions of o met before the tenure of o starts: one of a
                      # higher round fences the tenure at birth (it never serves); '0': not judged
    xrun='claim',     # an exclusion (adopt seal) names its claim's (listing's) run and `from`;
                      # 'cur': the writer's current run with the claim's `from`
    forget='never',   # when a remembered exclusion (j2start) is forgotten: 'never' (the model's
                      # default), 'idle' (only when no claim, adoption or K4 of the org is in
                      # progress: in the model every tenure start has one, so this is 'never'),
                      # 'ckpt' (the sixth review's candidate rule: once o's log shows a checkpoint
                      # of that round or higher; a mutation that must fail, J6-3)
    sealraise='frozen',  # a self-sealed run's retention value: 'frozen' at its last batch (the
                      # model's conservative default), 'seal' raised to its seal (J6-6's
                      # mutation), 'claims' raised to the lowest entry walks can still take (fix)
    c2gap='0',        # K1b: '0' C2 and the tenure's start are one step; '1' two steps (a
                      # writer resolves slots between its C2 LIST and its first serve)
    claimsrun='chain',  # J6-1 (scenario j61 only): the roster's `claims` list holds the writer's
                      # unsuperseded claims naming the run or an earlier run of its chain (the
                      # fix); 'cur': only claims naming the run itself (the fifth draft, mutation)
    cpwalk='1',       # J5: a higher claim found at a checkpoint triggers a walk (J4-4); '0':
                      # Fenced at once (the fourth draft; a liveness rule, not a mutation)
    late='0', after='1')


def opt(k):
    return ARGS.get('from' if k == 'frm' else k, DEFAULTS[k])


def nslots(run):
    return NSLOT.get(run, DEFAULT_SLOTS)


# ---------------------------------------------------------------- store helpers

def jget(J, run, slot):
    return J.get((run, slot))


def run_objs(J, run, start=1):
    return sorted((s, o) for (r, s), o in J.items() if r == run and s >= start)


def highest_floor(J, run):
    fl = [o[1] for (r, s), o in J.items() if r == run]
    return max(fl) if fl else 1


class FDict(dict):
    """A dict that is hashed by content (the store, logs and writers are kept as these)."""
    __slots__ = ()

    def __hash__(self):
        return hash(frozenset(self.items()))

    def set(self, k, v):
        d = FDict(self)
        d[k] = v
        return d

    def drop(self, k):
        d = FDict(self)
        del d[k]
        return d


# ---------------------------------------------------------------- the walk (K0)

def newest_cp(L, org):
    best = None
    for (g, seq), e in L.items():
        if g == org and e[0] == 'CP':
            if best is None or (e[1], seq) > (best[1][1], best[0]):
                best = (seq, e)
    return best


def walk(J, L, org, stop=frozenset()):
    """K0. Returns dict(kind='held'|'free'|'reached', run, entry, round, hist, visits, seals,
    head, maxround, reached=(run, slot)). `stop` is a set of (run, slot) of the caller's own
    fences: reaching one first ends the walk as 'reached'."""
    logents = [(seq, e) for (g, seq), e in L.items() if g == org]
    head = max([s for s, _ in logents], default=0)
    maxround = max([e[1] for _, e in logents], default=0)
    visits = []
    seals = []
    cp = newest_cp(L, org)
    hist = ()
    if cp is None:
        point, rnd = ('init',), 0
        pos = None
    else:
        _, e = cp
        rnd, hist = e[1], e[4]
        pos = (e[2], e[3] + 1)
        point = None
    steps = 0
    while True:
        steps += 1
        if steps > 20:
            raise RuntimeError('walk loops')
        if pos is None:
            # at a free point: the highest-seq claim naming it (K1b), unless after=0
            cands = [(seq, e) for seq, e in logents if e[0] == 'CL' and e[4] == point]
            if not cands or (opt('after') == '0' and point[0] == 'RS'):
                return dict(kind='free', point=point, round=rnd, hist=hist, visits=visits,
                            seals=seals, head=head, maxround=maxround)
            seq, e = max(cands)
            rnd = e[1]
            pos = (e[2], e[3])
            point = None
        run, entry = pos
        visits.append((run, entry))
        nxt = None
        for slot, o in run_objs(J, run, entry):
            if (run, slot) in stop:
                return dict(kind='reached', run=run, entry=entry, round=rnd, hist=hist,
                            visits=visits, seals=seals, reached=(run, slot), head=head,
                            maxround=maxround)
            k = o[0]
            if k == 'B':
                for (g, r, h) in o[2]:
                    if g == org and r == rnd:
                        hist = h
            elif k == 'X':
                if o[2] == org and o[3] > rnd:
                    rnd = o[3]
                    nxt = ('pos', (o[4], o[5]))
                    break
            elif k == 'SS':
                seals.append((run, slot))
                nxt = ('pos', (o[2], 1))
                break
            elif k == 'AS':
                seals.append((run, slot))
                rnd += 1
                nxt = ('pos', (o[2], o[3]))
                break
            elif k == 'RS':
                seals.append((run, slot))
                nxt = ('free', ('RS', run, slot))
                break
        if nxt is None:
            return dict(kind='held', run=run, entry=entry, round=rnd, hist=hist,
                        visits=visits, seals=seals, head=head, maxround=maxround)
        if nxt[0] == 'pos':
            pos = nxt[1]
        else:
            pos, point = None, nxt[1]


def owner(run):
    return run.rstrip('0123456789')


# ---------------------------------------------------------------- writers
# A writer is an FDict with keys:
#  name, run, gen (run counter), next, infl (frozenset of (slot, obj)), res (FDict slot->'o'|'f'|'x'),
#  sent (FDict slot->sects), lost (frozenset of (run, slot, obj)), held (tuple of
#  (org, round, hist, fslot)), st ('live'|'stopped'|'released'|'dead'), task, tries, nc, cps,
#  role flags: claim (org or ''), adopt (victim or ''), rel (bool), crash (bool)


def mkw(name, held=(), claim='', adopt='', rel=False, crash=False, idle=frozenset()):
    return FDict(ent=FDict((h[0], 1) for h in held), clent=frozenset(), met=frozenset(),
                 idle=frozenset(idle), name=name, run=name + '1', gen=1, next=1, infl=frozenset(), res=FDict(),
                 sent=FDict(), lost=frozenset(), held=tuple(held), st='live', task=None,
                 tries=0, nc=0, cps=frozenset(), claim=claim, adopt=adopt, rel=rel, crash=crash)


def floor_of(w):
    s = 1
    while w['res'].get(s) in ('o', 'f'):
        s += 1
    return s


def from_slot(w):
    """The `from` a claim, an exclusion or an adopt seal names in the writer's current run:
    the next unissued slot (`from=next`, the fourth draft) or the writer's floor, its lowest
    unresolved slot (`from=floor`, the fix of the fifth attack's J4-1)."""
    return floor_of(w) if opt('frm') == 'floor' else w['next']


def retain_below(w, slot):
    """T3: the lowest walk entry into the writer's current run it knows of: its held orgs'
    (fenced ones included until the writer drops them), and with `rb=claims` every claim it
    created naming this run (the fix of J4-2). A claim naming an earlier run of the writer
    enters this run at slot 1 through its self-seals (follow=1)."""
    ents = [e for g, e in w['ent'].items()]
    if opt('rb') == 'claims':
        ents += [f if r == w['run'] else 1 for (r, f) in w['clent']]
    return min(ents + [slot])


def tenure_entry(w, crun, frm):
    """The entry into the writer's current run of a tenure whose claim (or adopt seal) named
    (crun, frm): walks enter crun at frm and follow its self-seals into later runs at 1."""
    if opt('follow') == '1' and crun != w['run']:
        return 1
    return frm


def born_fenced(w, org, rnd, L=None):
    """J2 applied before the tenure starts: an exclusion of org of a higher round that the
    writer already resolved (in any of its runs) fences the tenure before it serves. With
    forget=ckpt an exclusion is forgotten (ignored) once org's log shows a checkpoint of its
    round or higher."""
    if opt('j2start') != '1':
        return False
    met = [r for (g, r) in w['met'] if g == org and r > rnd]
    if opt('forget') == 'ckpt' and L is not None:
        cps = [e[1] for (g, s), e in L.items() if g == org and e[0] == 'CP']
        met = [r for r in met if not any(c >= r for c in cps)]
    return bool(met)


def meet(w, obj):
    """Record an exclusion resolved as foreign (J2 judges it for held orgs now, for later
    tenures at their start)."""
    return w.set('met', w['met'] | {(obj[2], obj[3])})


def update_acks(w, T):
    """J1: the newest section of each held org in the resolved prefix, below its fence."""
    if w['st'] != 'live':
        return T
    pre = floor_of(w)
    for (org, rnd, hist, fslot) in w['held']:
        best = None
        for s in range(1, pre):
            if w['res'].get(s) == 'o' and (fslot is None or s < fslot):
                for (g, r, h) in w['sent'].get(s, ()):
                    if g == org and r == rnd:
                        best = h
        if best is not None:
            key = (org, rnd)
            t = T.get(key)
            if t is not None and len(best) > len(t[2]):
                T = T.set(key, (t[0], t[1], best))
    return T


def fence_held(w, org, xround, slot):
    held = []
    for (g, r, h, fs) in w['held']:
        if g == org and xround > r:
            fs = slot if fs is None else min(fs, slot)
        held.append((g, r, h, fs))
    return w.set('held', tuple(held))


def serving(w):
    return [h for h in w['held'] if h[3] is None]


def register(T, org, rnd, who, hist):
    """A tenure starts serving with hydrated hist. A second serving tenure of the same round
    is itself a violation (recorded as round -1)."""
    key = (org, rnd)
    if key in T:
        return T.set(('dup', org, rnd), (who, hist, ()))
    return T.set(key, (who, hist, ()))


def w_moves(S, wi):
    J, L, Ws, T, fails = S
    w = Ws[wi]
    out = []

    def put(w2, J2=J, L2=L, T2=T, fails2=fails):
        Ws2 = Ws[:wi] + (w2,) + Ws[wi + 1:]
        return (J2, L2, Ws2, T2, fails2)

    # in-flight creates settle, whatever the writer's state (a stopped writer's creates land too)
    for item in w['infl']:
        slot, obj = item
        run = w['run']
        w2 = w.set('infl', w['infl'] - {item})
        cur = jget(J, run, slot)
        if cur is None:
            J2 = J.set((run, slot), obj)
            w2 = w2.set('res', w2['res'].set(slot, 'o'))
            T2 = update_acks(w2, T)
            out.append(('%s lands %s/%d' % (w['name'], run, slot), put(w2, J2, L, T2)))
        else:
            w2 = w2.set('res', w2['res'].set(slot, 'f'))
            if cur[0] == 'X':
                w2 = fence_held(meet(w2, cur), cur[2], cur[3], slot)
            elif cur[0] == 'AS':
                w2 = w2.set('st', 'stopped')
            T2 = update_acks(w2, T)
            out.append(('%s collides %s/%d with %s' % (w['name'], run, slot, cur[0]), put(w2, J, L, T2)))
        if fails < MAXFAIL:
            w3 = w.set('infl', w['infl'] - {item}).set('res', w['res'].set(slot, 'x'))
            if opt('late') == '1':
                w3 = w3.set('lost', w3['lost'] | {(run, slot, obj)})
            out.append(('%s put fails %s/%d' % (w['name'], run, slot), put(w3, J, L, T, fails + 1)))
    for item in w['lost']:
        run, slot, obj = item
        w2 = w.set('lost', w['lost'] - {item})
        J2 = J if jget(J, run, slot) is not None else J.set((run, slot), obj)
        out.append(('late landing %s/%d' % (run, slot), put(w2, J2)))
    if w['st'] != 'live':
        return out
    if w['crash'] and not w['infl']:
        out.append(('%s crashes' % w['name'], put(w.set('st', 'dead').set('task', None))))
    run = w['run']
    blocked = 'x' in w['res'].values()
    # issue a batch (J7's policy is cost only: the model issues whenever the window allows)
    if serving(w) and not blocked and w['task'] is None:
        nxt, fl = w['next'], floor_of(w)
        if nxt <= nslots(run) and nxt < fl + W:
            nc = w['nc'] + 1
            held, sects = [], []
            for (g, r, h, fs) in w['held']:
                # an idle org commits once (its attach), then has no section (J1: sections of
                # orgs that committed since the last batch)
                if fs is None and not (g in w['idle'] and any(c[0] == w['name'] for c in h)):
                    h = h + ((w['name'], nc),)
                    sects.append((g, r, h))
                held.append((g, r, h, fs))
            obj = ('B', fl, tuple(sects), retain_below(w, nxt))
            w2 = w.set('nc', nc).set('held', tuple(held)).set('next', nxt + 1)
            w2 = w2.set('infl', w['infl'] | {(nxt, obj)}).set('sent', w['sent'].set(nxt, tuple(sects)))
            out.append(('%s issues %s/%d' % (w['name'], run, nxt), put(w2)))
    # J3: settle, then self-seal the lowest unresolved slot
    if blocked and not w['infl']:
        Ls = floor_of(w)
        cur = jget(J, run, Ls)
        gen = w['gen'] + 1
        cont = w['name'] + str(gen)
        if cur is None:
            J2 = J.set((run, Ls), ('SS', Ls, cont))
            T2 = update_acks(w, T)
            held = tuple(h for h in w['held'] if h[3] is None)
            w2 = w.set('run', cont).set('gen', gen).set('next', 1).set('res', FDict()) \
                  .set('sent', FDict()).set('held', held) \
                  .set('ent', FDict((h[0], 1) for h in held))
            if opt('follow') != '1':
                w2 = w2.set('clent', frozenset())
            out.append(('%s self-seals %s/%d -> %s' % (w['name'], run, Ls, cont), put(w2, J2, L, T2)))
        else:
            if cur[0] == 'B':
                # our own late batch (nothing else writes batches in our run)
                w2 = w.set('res', w['res'].set(Ls, 'o'))
                w2 = w2.set('lost', frozenset(i for i in w2['lost'] if i[:2] != (run, Ls)))
            elif cur[0] == 'X':
                w2 = fence_held(meet(w.set('res', w['res'].set(Ls, 'f')), cur), cur[2], cur[3], Ls)
            elif cur[0] == 'AS':
                w2 = w.set('st', 'stopped')
            else:
                raise RuntimeError('self-seal meets %r' % (cur,))
            T2 = update_acks(w2, T)
            out.append(('%s self-seal collides %s/%d with %s' % (w['name'], run, Ls, cur[0]),
                        put(w2, J, L, T2)))
    # J4: release seal after a drain (nothing in flight, nothing unresolved)
    if w['rel'] and serving(w) and not blocked and not w['infl'] and w['task'] is None:
        Ls = floor_of(w)
        if Ls == w['next']:
            cur = jget(J, run, Ls)
            if cur is None:
                J2 = J.set((run, Ls), ('RS', Ls))
                out.append(('%s release-seals %s/%d' % (w['name'], run, Ls),
                            put(w.set('st', 'released'), J2)))
            elif cur[0] == 'X':
                w2 = fence_held(meet(w.set('res', w['res'].set(Ls, 'f')).set('next', Ls + 1), cur),
                                cur[2], cur[3], Ls)
                out.append(('%s release seal collides with X' % w['name'], put(w2, J, L, update_acks(w2, T))))
            elif cur[0] == 'AS':
                out.append(('%s release seal collides with AS' % w['name'], put(w.set('st', 'stopped'))))
    # J5: a checkpoint of a held org (once per org per writer), through the prefix below its fence
    for (g, r, h, fs) in w['held']:
        if fs is not None or g in w['cps']:
            continue
        pre = floor_of(w)
        best = None
        for s in range(1, pre):
            if w['res'].get(s) == 'o':
                for (gg, rr, hh) in w['sent'].get(s, ()):
                    if gg == g and rr == r:
                        best = (s, hh)
        if best is None:
            continue
        logents = [(seq, e) for (gg, seq), e in L.items() if gg == g]
        if any(e[0] == 'CL' and e[1] > r for _, e in logents):
            # a claim of a higher round above ours (J5's collision): with cpwalk=1 a walk decides
            # (J4-4: Fenced only if the walk no longer ends in this tenure); with cpwalk=0 the
            # fourth draft's rule, Fenced at once (safe, but an abandoned claim fences a live holder)
            wk = walk(J, L, g)
            mine = wk['kind'] == 'held' and wk['run'] == run and wk['round'] == r
            if opt('cpwalk') != '1' or not mine:
                w2 = fence_held(w, g, r + 1, floor_of(w))
                out.append(('%s checkpoint of %s refused: fenced' % (w['name'], g), put(w2)))
                continue
        seq = max([s for s, _ in logents], default=0) + 1
        L2 = L.set((g, seq), ('CP', r, run, best[0], best[1]))
        out.append(('%s checkpoints %s through %s/%d' % (w['name'], g, run, best[0]),
                    put(w.set('cps', w['cps'] | {g}).set('ent', w['ent'].set(g, best[0] + 1)), J, L2)))
    # claim and adopt tasks
    out += claim_moves(S, wi, put)
    out += adopt_moves(S, wi, put)
    return out


# ---------------------------------------------------------------- K1 / K1b

def claim_moves(S, wi, put):
    J, L, Ws, T, fails = S
    w = Ws[wi]
    org = w['claim']
    if not org or any(h[0] == org for h in w['held']):
        return []
    t = w['task']
    out = []
    me = w['name']
    if t is None:
        if w['tries'] >= MAXTRY:
            return []
        wk = walk(J, L, org)
        if wk['kind'] == 'free':
            rnd = max(wk['maxround'], wk['round']) + 1
            task = ('fclaim', wk['point'], wk['hist'], wk['head'], rnd)
            out.append(('%s walks %s: free at %s' % (me, org, wk['point']), put(w.set('task', task))))
        elif owner(wk['run']) != me:
            rnd = max(wk['maxround'], wk['round']) + 1
            listing = frozenset(s for s, _ in run_objs(J, wk['run'], wk['entry']))
            f = max([wk['entry']] + [o[1] for _, o in run_objs(J, wk['run'], wk['entry'])])
            task = ('claim', rnd, wk['run'], wk['entry'], listing, f)
            out.append(('%s walks %s: held in %s' % (me, org, wk['run']), put(w.set('task', task))))
        return out
    kind = t[0]
    if kind == 'fclaim':
        _, point, hist, head, rnd = t
        if (org, head + 1) in L:
            out.append(('%s free claim collides' % me, put(w.set('task', None).set('tries', w['tries'] + 1))))
        else:
            frm, crun = from_slot(w), w['run']
            L2 = L.set((org, head + 1), ('CL', rnd, crun, frm, point, me))
            w2 = w.set('task', ('fcheck', head + 1, rnd, hist, crun, frm))
            w2 = w2.set('clent', w['clent'] | {(crun, frm)})
            out.append(('%s claims %s at log %d after %s (round %d, from %s/%d)'
                        % (me, org, head + 1, point, rnd, w['run'], frm), put(w2, J, L2)))
    elif kind == 'fcheck' and opt('c2gap') == '1':
        # K1b.2 and K1b.3 as two steps: C2's LIST passes, then (after the hydrate) the tenure
        # starts, J2 at birth judged then
        _, seq, rnd, hist, crun, frm = t
        if any(g == org and s > seq for (g, s) in L):
            out.append(('%s C2 finds an entry above: abandoned' % me,
                        put(w.set('task', None).set('tries', w['tries'] + 1))))
        else:
            out.append(('%s C2 passes' % me, put(w.set('task', ('fserve',) + t[1:]))))
    elif kind in ('fcheck', 'fserve'):
        _, seq, rnd, hist, crun, frm = t
        if kind == 'fcheck' and any(g == org and s > seq for (g, s) in L):
            out.append(('%s C2 finds an entry above: abandoned' % me,
                        put(w.set('task', None).set('tries', w['tries'] + 1))))
        elif born_fenced(w, org, rnd, L):
            out.append(('%s met an exclusion of %s of a higher round: fenced before serving' % (me, org),
                        put(w.set('task', None).set('tries', MAXTRY))))
        else:
            w2 = w.set('task', None).set('held', w['held'] + ((org, rnd, hist, None),))
            w2 = w2.set('ent', w2['ent'].set(org, tenure_entry(w, crun, frm)))
            T2 = register(T, org, rnd, me, hist)
            out.append(('%s serves %s after a free walk, round %d, hydrated %s' % (me, org, rnd, hist),
                        put(w2, J, L, T2)))
    elif kind == 'claim':
        _, rnd, run, entry, listing, f = t
        # C1: the claim goes at head + 1 of the log as it is now, round 1 + the highest there
        # (and above the walk's); a collision would re-read, so the append is atomic here
        logents = [(s, e) for (g, s), e in L.items() if g == org]
        seq = max([s for s, _ in logents], default=0) + 1
        rnd = max([rnd] + [e[1] + 1 for _, e in logents])
        frm, crun = from_slot(w), w['run']
        L2 = L.set((org, seq), ('CL', rnd, crun, frm, None, me))
        task = ('place', rnd, run, entry, listing, f, (), (crun, frm))
        out.append(('%s claims %s at log %d (round %d, from %s/%d)' % (me, org, seq, rnd, crun, frm),
                    put(w.set('task', task).set('clent', w['clent'] | {(crun, frm)}), J, L2)))
    elif kind == 'place':
        _, rnd, run, entry, listing, f, fences, cf = t
        crun, frm = cf
        xr = crun if opt('xrun') == 'claim' else w['run']
        slot = f
        while slot in listing:
            slot += 1
        if slot > nslots(run) + 1:
            return [('%s gives up placing' % me, put(w.set('task', None).set('tries', MAXTRY)))]
        cur = jget(J, run, slot)
        obj = ('X', f, org, rnd, xr, frm, me)
        if cur is None:
            J2 = J.set((run, slot), obj)
            task = ('recheck', rnd, run, entry, f, fences + ((run, slot),), cf)
            out.append(('%s excludes %s at %s/%d (f=%d)' % (me, org, run, slot, f),
                        put(w.set('task', task), J2)))
        elif cur[0] == 'B':
            task = ('place', rnd, run, entry, listing | {slot}, f, fences, cf)
            out.append(('%s exclusion collides with a batch at %s/%d: next slot' % (me, run, slot),
                        put(w.set('task', task))))
        else:
            wk = walk(J, L, org)
            if wk['kind'] == 'held' and owner(wk['run']) != me and wk['round'] < rnd:
                lst = frozenset(s for s, _ in run_objs(J, wk['run'], wk['entry']))
                f2 = max([wk['entry']] + [o[1] for _, o in run_objs(J, wk['run'], wk['entry'])])
                task = ('place', rnd, wk['run'], wk['entry'], lst, f2, (), cf)
                out.append(('%s exclusion collides with %s: re-walk, same claim' % (me, cur[0]),
                            put(w.set('task', task))))
            else:
                out.append(('%s exclusion collides with %s: claim abandoned' % (me, cur[0]),
                            put(w.set('task', None).set('tries', w['tries'] + 1))))
    elif kind == 'recheck':
        _, rnd, run, entry, f, fences, cf = t
        crun, frm = cf
        xr = crun if opt('xrun') == 'claim' else w['run']
        wk = walk(J, L, org, stop=frozenset(fences))
        if wk['kind'] == 'reached' and wk['reached'][0] == run and wk['entry'] == entry:
            q = wk['reached'][1]
            holes = [s for s in range(f, q) if jget(J, run, s) is None]
            if holes:
                s = holes[0]
                J2 = J.set((run, s), ('X', f, org, rnd, xr, frm, me))
                task = ('recheck', rnd, run, entry, f, fences + ((run, s),), cf)
                out.append(('%s second exclusion at %s/%d' % (me, run, s), put(w.set('task', task), J2)))
            elif born_fenced(w, org, rnd, L):
                out.append(('%s met an exclusion of %s of a higher round: fenced before serving'
                            % (me, org), put(w.set('task', None).set('tries', MAXTRY))))
            else:
                w2 = w.set('task', None).set('held', w['held'] + ((org, rnd, wk['hist'], None),))
                w2 = w2.set('ent', w2['ent'].set(org, tenure_entry(w, crun, frm)))
                T2 = register(T, org, rnd, me, wk['hist'])
                out.append(('%s serves %s, round %d, hydrated %s' % (me, org, rnd, wk['hist']),
                            put(w2, J, L, T2)))
        else:
            out.append(('%s re-walk voids its fence' % me,
                        put(w.set('task', None).set('tries', w['tries'] + 1))))
    return out


# ---------------------------------------------------------------- K2

def chain_end(J, victim):
    run = victim + '1'
    while True:
        objs = run_objs(J, run)
        ss = [o for _, o in objs if o[0] == 'SS']
        if ss:
            run = ss[0][2]
            continue
        return run


def k23_learned(J, victim):
    """K2.3 (scenario j61): the orgs the adopter learns: those in the newest roster that exists
    (a run's first batch; read back along the chain's self-seals) and in the sections and
    `claims` lists of every batch after it. A batch's optional fifth field is its `claims` list,
    ((org, run, from), ...)."""
    chain = []
    run = victim + '1'
    while True:
        chain.append(run)
        ss = [o for _, o in run_objs(J, run) if o[0] == 'SS']
        if not ss:
            break
        run = ss[0][2]
    start = 0
    for i, r in enumerate(chain):
        if any(o[0] == 'B' for _, o in run_objs(J, r)):
            start = i
    learned = set()
    for r in chain[start:]:
        for _, o in run_objs(J, r):
            if o[0] == 'B':
                learned |= set(g for (g, _, _) in o[2])
                if len(o) > 4:
                    learned |= set(c[0] for c in o[4])
    return learned


def adopt_moves(S, wi, put):
    J, L, Ws, T, fails = S
    w = Ws[wi]
    victim = w['adopt']
    if not victim:
        return []
    t = w['task']
    me = w['name']
    out = []
    if t is None:
        if w['tries'] >= 1:
            return []
        run = chain_end(J, victim)
        objs = run_objs(J, run)
        if any(o[0] in ('AS', 'RS') for _, o in objs):
            return [('%s: %s already sealed' % (me, run), put(w.set('tries', 1)))]
        f = max([1] + [o[1] for _, o in objs])
        task = ('aseal', run, frozenset(s for s, _ in objs), f, (), (w['run'], from_slot(w)))
        return [('%s lists %s to adopt' % (me, run), put(w.set('task', task)))]
    if t[0] == 'aseal':
        _, run, listing, f, seals, cf = t
        crun, frm = cf
        xr = crun if opt('xrun') == 'claim' else w['run']
        slot = f
        while slot in listing:
            slot += 1
        cur = jget(J, run, slot)
        if cur is None:
            J2 = J.set((run, slot), ('AS', f, xr, frm))
            task = ('arecheck', run, f, seals + (slot,), cf)
            out.append(('%s adopt-seals %s/%d (f=%d)' % (me, run, slot, f), put(w.set('task', task), J2)))
        elif cur[0] in ('B', 'X'):
            out.append(('%s adopt seal collides with %s: next slot' % (me, cur[0]),
                        put(w.set('task', ('aseal', run, listing | {slot}, f, seals, cf)))))
        elif cur[0] == 'SS':
            out.append(('%s adopt seal collides with a self-seal: follow' % me, put(w.set('task', None))))
        else:
            out.append(('%s adopt seal collides with %s: done' % (me, cur[0]),
                        put(w.set('task', None).set('tries', 1))))
    elif t[0] == 'arecheck':
        _, run, f, seals, cf = t
        crun, frm = cf
        xr = crun if opt('xrun') == 'claim' else w['run']
        low = min(seals)
        others = [s for s, o in run_objs(J, run) if o[0] in ('SS', 'AS', 'RS') and s < low]
        if others:
            return [('%s finds another seal below its own: done' % me, put(w.set('task', None).set('tries', 1)))]
        holes = [s for s in range(f, low) if jget(J, run, s) is None]
        if holes:
            s = holes[0]
            J2 = J.set((run, s), ('AS', f, xr, frm))
            return [('%s second adopt seal at %s/%d' % (me, run, s),
                     put(w.set('task', ('arecheck', run, f, seals + (s,), cf)), J2))]
        held = list(w['held'])
        ent = w['ent']
        T2 = T
        got = []
        learned = k23_learned(J, victim) if SCENARIOS[CUR_SCEN].get('roster') else set(ORGS)
        for org in ORGS:
            wk = walk(J, L, org)
            passed = any(r == run and s in seals for (r, s) in wk['seals'])
            if org in learned and wk['kind'] == 'held' and wk['run'] == w['run'] and passed \
                    and not born_fenced(w, org, wk['round'], L):
                held.append((org, wk['round'], wk['hist'], None))
                ent = ent.set(org, tenure_entry(w, crun, frm))
                T2 = register(T2, org, wk['round'], me, wk['hist'])
                got.append(org)
        w2 = w.set('task', None).set('tries', 1).set('held', tuple(held)).set('ent', ent)
        out.append(('%s adopts %s' % (me, got), put(w2, J, L, T2)))
    return out


# ---------------------------------------------------------------- retention

def r_moves(S):
    J, L, Ws, T, fails = S
    mode = opt('retain')
    if mode == 'none':
        return []
    entries = {}   # org -> {run: entry}
    for org in ORGS:
        wk = walk(J, L, org)
        d = {}
        for (r, e) in wk['visits']:
            d[r] = min(d.get(r, e), e)
        entries[org] = d
    out = []
    runs = sorted(set(r for (r, s) in J))
    for run in runs:
        F = highest_floor(J, run)
        objs = run_objs(J, run)
        if mode == 'below':
            # T3 as written: below min(retain_below of the highest kept batch, highest floor),
            # retain_below computed by the run's writer from what it knows (not an oracle)
            bs = [(s, o) for s, o in objs if o[0] == 'B']
            if not bs:
                continue
            m = min(bs[-1][1][3], F)
            ss = [s for s, o in objs if o[0] == 'SS']
            if ss and opt('sealraise') != 'frozen':
                # the `retain` raise of a self-sealed run (J4-7): 'seal' raises its value to the
                # seal (J6-6's mutation); 'claims' to the lowest entry walks can still take into
                # it: the `from` of every claim, exclusion and adopt seal naming it, and
                # `through` + 1 of every newest checkpoint through one of its slots (J6-6's fix)
                raised = ss[0]
                if opt('sealraise') == 'claims':
                    # a claim counts until superseded: its org's log shows a newer checkpoint
                    ents = [e[3] for (g, q), e in L.items() if e[0] == 'CL' and e[2] == run
                            and not any(gg == g and qq > q and ee[0] == 'CP'
                                        for (gg, qq), ee in L.items())]
                    ents += [o[5] for o in J.values() if o[0] == 'X' and o[4] == run]
                    ents += [o[3] for o in J.values() if o[0] == 'AS' and o[2] == run]
                    for g in ORGS:
                        cp = newest_cp(L, g)
                        if cp is not None and cp[1][2] == run:
                            ents.append(cp[1][3] + 1)
                    raised = min([raised] + ents)
                m = max(m, raised)
            for slot, o in bs:
                if slot < m:
                    out.append(('R deletes %s/%d (m=%d)' % (run, slot, m),
                                (J.drop((run, slot)), L, Ws, T, fails)))
            continue
        for slot, o in objs:
            if o[0] != 'B' or slot >= F:
                continue
            if mode == 'prefix':
                ok = all(entries[g].get(run, 10 ** 6) > slot for g in ORGS)
            else:   # 'batch' (third draft): only orgs with a section in it
                ok = all(entries[g].get(run, 10 ** 6) > slot for (g, _, _) in o[2])
            if ok:
                out.append(('R deletes %s/%d' % (run, slot), (J.drop((run, slot)), L, Ws, T, fails)))
        if mode == 'wholerun':
            sealed = any(o[0] in ('SS', 'AS', 'RS') for _, o in objs)
            if sealed and all(run not in entries[g] for g in ORGS):
                J2 = FDict((k, v) for k, v in J.items() if k[0] != run)
                out.append(('R deletes run %s whole' % run, (J2, L, Ws, T, fails)))
    return out


# ---------------------------------------------------------------- property and search

def is_prefix(a, b):
    return len(a) <= len(b) and b[:len(a)] == a


def violation(S):
    T = S[3]
    for k, v in T.items():
        if k[0] == 'dup':
            return 'two serving tenures of %s share round %d' % (k[1], k[2])
    for (k1, v1) in T.items():
        for (k2, v2) in T.items():
            if k1[0] == k2[0] and k1[1] < k2[1] and not is_prefix(v1[2], v2[1]):
                return ('%s acknowledged %s in tenure (%s, round %d), not in what %s hydrated for '
                        'round %d: %s' % (v1[0], v1[2], k1[0], k1[1], v2[0], k2[1], v2[1]))
    return None


SCENARIOS = {
    # holder H of o and p; C a forced claimant of o
    'claim': dict(writers=lambda: (mkw('H', held=(('o', 1, (), None), ('p', 1, (), None))),
                                   mkw('C', claim='o')), maxfail=1, maxtry=1),
    # holder H of o and p (it goes on as a zombie); adopter A of H; C a forced claimant of o
    'adopt': dict(writers=lambda: (mkw('H', held=(('o', 1, (), None), ('p', 1, (), None))),
                                   mkw('A', adopt='H'), mkw('C', claim='o')), maxfail=0, maxtry=1),
    # holder H releases; B and C claim o (after the free walk, or from each other); B may crash
    'release': dict(writers=lambda: (mkw('H', held=(('o', 1, (), None), ('p', 1, (), None)), rel=True),
                                     mkw('B', claim='o', crash=True), mkw('C', claim='o')),
                    maxfail=0, maxtry=1),
    # two claimants of o against H, whose o goes idle after one commit (p keeps committing),
    # with retention: a paused claimant's late exclusion in a retention hole (T3)
    'stale': dict(writers=lambda: (mkw('H', held=(('o', 1, (), None), ('p', 1, (), None)), idle=('o',)),
                                   mkw('C', claim='o'), mkw('D', claim='o')), maxfail=0, maxtry=1,
                  slots={'H1': 4}),
}

# K1b (fifth attack): o starts free; B holds p (window 2) and claims o after the free walk
# while its own batches are in flight; one of B's puts may fail (self-seal); D claims o
SCENARIOS['k1b'] = dict(writers=lambda: (mkw('B', held=(('p', 1, (), None),), claim='o'),
                                         mkw('D', claim='o')), maxfail=1, maxtry=1,
                        slots={'B1': 3, 'B2': 2})
# the same after a release seal: H holds o and releases it; B (holding p) and D claim o
SCENARIOS['k1brel'] = dict(writers=lambda: (mkw('H', held=(('o', 1, (), None),), rel=True),
                                            mkw('B', held=(('p', 1, (), None),), claim='o'),
                                            mkw('D', claim='o')), maxfail=1, maxtry=1,
                           slots={'H1': 1, 'B1': 3, 'B2': 2})
# T3 (fifth attack): o starts free; P holds p and claims o (K1b); D and E claim o (K1); P's
# claim may be abandoned by C2 yet stay the highest-seq claim naming the free point, so walks
# enter P's run at its `from`; retention by the writer's own retain_below (retain=below)
SCENARIOS['t3'] = dict(writers=lambda: (mkw('P', held=(('p', 1, (), None),), claim='o'),
                                        mkw('D', claim='o'), mkw('E', claim='o')),
                       maxfail=0, maxtry=1, slots={'P1': 3})

# K1 by a claimant with its own org in flight: H holds o; C holds p (window 2, one failed put
# possible) and claims o by K1 (exclusion in H's run); D claims o (its walk may pass C's
# exclusion into C's run while C's own batches are in flight there)
SCENARIOS['k1p'] = dict(writers=lambda: (mkw('H', held=(('o', 1, (), None),)),
                                         mkw('C', held=(('p', 1, (), None),), claim='o'),
                                         mkw('D', claim='o')), maxfail=1, maxtry=1,
                        slots={'H1': 1, 'C1': 2, 'C2': 2})

# J6-1 (sixth attack): the finding's steps 1-5 as the initial store (W's claim and self-seal are
# reachable in k1b; starting after them keeps the state count small). o is free at the initial
# point; W held p in W1 and claimed o by K1b (log o/1: round 1, run W1, from 1, after the free
# point), the claim in progress (or abandoned but still the highest naming the free point); W's
# put of W1/1 failed, W self-sealed W1/1 -> W2, and W2/1 landed: the roster, sections [p],
# `claims` [] (claimsrun=cur: c names W1) or [(o, W1, 1)] (claimsrun=chain); then W stops (dead
# or paused: A is forced). A adopts W learning orgs by K2.3 (roster + `claims`) and counts in its
# retain_below only the orgs it adopted; E and F claim o by K1.
def j61_preset(J, L, T):
    cl = (('o', 'W1', 1),) if opt('claimsrun') == 'chain' else ()
    hp = (('W', 1),)
    J = J.set(('W1', 1), ('SS', 1, 'W2'))
    J = J.set(('W2', 1), ('B', 1, (('p', 1, hp),), 1, cl))
    L = L.set(('o', 1), ('CL', 1, 'W1', 1, ('init',), 'W'))
    L = L.set(('p', 1), ('CL', 1, 'W1', 1, ('init',), 'W'))
    T = T.set(('p', 1), ('W', (), hp))
    return J, L, T


SCENARIOS['j61'] = dict(writers=lambda: (mkw('W').set('st', 'dead'), mkw('A', adopt='W'),
                                         mkw('E', claim='o'), mkw('F', claim='o')),
                        maxfail=0, maxtry=1, slots={'A1': 3}, roster=True, preset=j61_preset)

MAXFAIL = 2
MAXTRY = 2
CUR_SCEN = None

# `python3 model.py` runs these (the fifth draft's rules); k1brel is left out: it is not
# exhaustive within 10 minutes and 6 GB (README).
DEFAULT_RUNS = (('claim', {}), ('claim', {'late': '1'}), ('adopt', {}), ('adopt', {'maxfail': '1'}),
                ('release', {}), ('stale', {}), ('k1b', {}), ('t3', {}), ('k1p', {}), ('j61', {}))

# `python3 model.py mutations`: each must find a violation.
MUTATIONS = (dict(scenario='release', after='0'),          # J3-1: a free walk ignores `after`
             dict(scenario='adopt', retain='wholerun'),    # J3-3: whole-run deletion
             dict(scenario='stale', retain='batch'),       # the third draft's per-batch rule
             dict(scenario='k1b', **{'from': 'next'}),     # J4-1
             dict(scenario='t3', rb='held'),               # J4-2
             dict(scenario='k1b', follow='0'),             # entries dropped at a self-seal
             dict(scenario='k1p', j2start='0'),            # J2 not applied before the tenure
             dict(scenario='k1p', xrun='cur'),             # exclusion names the current run
             dict(scenario='k1b', forget='ckpt', c2gap='1'),  # J6-3: forget at a checkpoint
             dict(scenario='claim', sealraise='seal'),    # J6-6: a sealed run raised to its seal
             dict(scenario='j61', claimsrun='cur'),       # J6-1: `claims` lists the current run's
             )


def init_store(scen):
    J = FDict()
    L = FDict()
    T = FDict()
    Ws = SCENARIOS[scen]['writers']()
    for w in Ws:
        for (org, rnd, hist, _) in w['held']:
            L = L.set((org, 1), ('CL', rnd, w['run'], 1, ('init',), w['name']))
            T = register(T, org, rnd, w['name'], hist)
    if 'preset' in SCENARIOS[scen]:
        J, L, T = SCENARIOS[scen]['preset'](J, L, T)
    return (J, L, Ws, T, 0)


def stats_of(S, st):
    J, L, Ws, T, fails = S
    for k, v in T.items():
        if k[0] != 'dup' and v[0] != 'H':
            st['a successor serves'] += 1
            break
    if any(v[0] != 'H' and len(v[2]) > len(v[1]) for k, v in T.items() if k[0] != 'dup'):
        st['a successor acknowledges'] += 1
    if any(v[0] == 'H' and len(v[2]) > 0 for k, v in T.items() if k[0] != 'dup'):
        st['the holder acknowledges'] += 1
    if any(v[0] == 'H' and len(v[2]) > 0 for k, v in T.items() if k[0] != 'dup') and \
            any(v[0] != 'H' for k, v in T.items() if k[0] != 'dup'):
        st['holder acked and a successor serves'] += 1
    h = Ws[0]
    if h['st'] == 'stopped' or any(x[3] is not None for x in h['held']):
        st['the holder is fenced'] += 1
    if any(o[0] == 'SS' for o in J.values()):
        st['a self-seal landed'] += 1
    if any(o[0] == 'AS' for o in J.values()):
        st['an adopt seal landed'] += 1
    if any(o[0] == 'RS' for o in J.values()):
        st['a release seal landed'] += 1
    if any(v[0] == 'A' for v in T.values()):
        st['the adopter serves'] += 1
    if any(k[0] == 'o' and v[0] == 'A' for k, v in T.items()):
        st['the adopter serves o'] += 1
    if sum(1 for k, v in T.items() if k[0] == 'o' and v[0] != 'H') >= 2:
        st['two successive successors of o serve'] += 1
    if any(e[0] == 'CP' for e in L.values()):
        st['a checkpoint landed'] += 1
    os_ = sorted((k[1], v) for k, v in T.items() if k[0] == 'o')
    if len(os_) >= 2 and any(len(v[2]) > len(v[1]) for r, v in os_[:-1]):
        st['o: an acking tenure, then a later tenure serves'] += 1


def search(scen, quiet=False):
    global MAXFAIL, MAXTRY, CUR_SCEN
    CUR_SCEN = scen
    sc = SCENARIOS[scen]
    MAXFAIL = int(ARGS.get('maxfail', sc['maxfail']))
    MAXTRY = int(ARGS.get('maxtry', sc['maxtry']))
    NSLOT.clear()
    NSLOT.update({'H1': 3, 'H2': 2})
    NSLOT.update(sc.get('slots', {}))
    s0 = init_store(scen)
    seen = {s0: None}
    q = deque([s0])
    nxtq = deque()
    depth = 0
    deleted = 0
    t0 = time.time()
    tick = t0
    st = {k: 0 for k in ('a successor serves', 'a successor acknowledges', 'the holder acknowledges',
                         'holder acked and a successor serves', 'the holder is fenced',
                         'a self-seal landed', 'an adopt seal landed', 'a release seal landed',
                         'the adopter serves', 'the adopter serves o', 'two successive successors of o serve',
                         'a checkpoint landed', 'o: an acking tenure, then a later tenure serves')}
    while q or nxtq:
        if not q:
            q, nxtq = nxtq, q
            depth += 1
        if time.time() - tick > 30:
            tick = time.time()
            sys.stderr.write('  %s: depth %d, %d states, %.0f s\n' % (scen, depth, len(seen), tick - t0))
            sys.stderr.flush()
        s = q.popleft()
        v = violation(s)
        if v:
            trace = []
            x = s
            while seen[x] is not None:
                trace.append(seen[x][1])
                x = seen[x][0]
            trace.reverse()
            print('%s: VIOLATION after %d states (%.0f s): %s' % (desc(scen), len(seen),
                                                                 time.time() - t0, v))
            for i, lab in enumerate(trace, 1):
                print('  %2d. %s' % (i, lab))
            return False, len(seen)
        stats_of(s, st)
        succ = []
        for wi in range(len(s[2])):
            succ += w_moves(s, wi)
        rm = r_moves(s)
        if rm:
            deleted += 1
        succ += rm
        for lab, t in succ:
            if t not in seen:
                seen[t] = (s, lab)
                nxtq.append(t)
    print('%s: no violation in %d states, depth %d (%.0f s)' % (desc(scen), len(seen), depth,
                                                               time.time() - t0))
    if not quiet:
        print('   reachable: ' + '; '.join('%s in %d' % (k, n) for k, n in st.items() if n) +
              '; retention can delete in %d' % deleted)
    return True, len(seen)


def desc(scen):
    changed = ' '.join('%s=%s' % ('from' if k == 'frm' else k, opt(k)) for k in DEFAULTS
                       if opt(k) != DEFAULTS[k])
    return 'scenario=%s%s maxfail=%s maxtry=%s' % (
        scen, ' ' + changed if changed else ' (defaults)',
        ARGS.get('maxfail', SCENARIOS[scen]['maxfail']), ARGS.get('maxtry', SCENARIOS[scen]['maxtry']))


def main(argv):
    global ARGS
    if argv and argv[0] == 'mutations':
        ok = True
        for a in MUTATIONS:
            # each must find a violation
            ARGS = a
            good, _ = search(a['scenario'], quiet=True)
            ok = ok and not good
        return 0 if ok else 1
    ARGS = dict(x.split('=') for x in argv)
    if 'scenario' in ARGS:
        good, _ = search(ARGS['scenario'])
        return 0 if good else 1
    allgood = True
    for scen, extra in DEFAULT_RUNS:
        ARGS = dict(extra)
        good, _ = search(scen)
        allgood = allgood and good
    return 0 if allgood else 1


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
