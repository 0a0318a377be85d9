"""Turn `vgpu replay --json` outputs into the markdown results table of docs/placement.md.

Usage: .venv/bin/python bench/replay_table.py default.json gpushare20.json ...   (trace name = file stem)
"""
import json, os
import numpy as np
import sys
rows=[]
files=sys.argv[1:]
print("| trace | policy | seeds | unalloc % @100 mean ± sd (median) | unalloc % @130 mean ± sd (median) | failed pods | s/run |")
print("|---|---|---|---|---|---|---|")
for f in files:
    tr=os.path.basename(f).rsplit('.',1)[0]

    if not os.path.exists(f) or os.path.getsize(f)==0: continue
    res=json.load(open(f))['results']
    pols=[]
    for r in res:
        if r['policy'] not in pols: pols.append(r['policy'])
    for p in pols:
        m=[r for r in res if r['policy']==p]
        a=np.array([r['unallocated_pct_at_100'] for r in m]); b=np.array([r['unallocated_pct_at_130'] for r in m])
        print(f"| {tr.replace('_more','')} | {p} | {len(m)} | {a.mean():.2f} ± {a.std(ddof=1):.2f} ({np.median(a):.2f}) | {b.mean():.2f} ± {b.std(ddof=1):.2f} ({np.median(b):.2f}) | {np.mean([r['failed_pods'] for r in m]):.0f} | {np.mean([r['seconds'] for r in m]):.1f} |")
    if 'fgd' in pols and 'fragaware' in pols:
        f_=np.array([r['unallocated_pct_at_100'] for r in res if r['policy']=='fgd']); o=np.array([r['unallocated_pct_at_100'] for r in res if r['policy']=='fragaware'])
        f3=np.array([r['unallocated_pct_at_130'] for r in res if r['policy']=='fgd']); o3=np.array([r['unallocated_pct_at_130'] for r in res if r['policy']=='fragaware'])
        print(f"|  | paired ours − fgd | | {np.mean(o-f_):+.2f} (ours better on {int((o<f_).sum())}/{len(o)} seeds) | {np.mean(o3-f3):+.2f} | | |")
