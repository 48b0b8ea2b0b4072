#!/bin/bash
# alternating: pytest --co on a generated suite of 200 tests, plugin at HEAD vs at 96379f7 (before the register)
mkdir -p /tmp/co-suite && cd /tmp/co-suite
python3 -c "
for i in range(20):
    open(f'test_m{i}.py','w').write(''.join(f'def test_{j}():\n    pass\n' for j in range(10)))
"
for round in 1 2 3 4 5; do
  for side in head before; do
    if [ $side = head ]; then pp=/work/main; else pp=/tmp/wt-before; fi
    s=$(date +%s.%N)
    PYTHONPATH=$pp /work/venvs/t213/bin/python -m pytest --co -q -p no:cacheprovider > /dev/null 2>&1
    e=$(date +%s.%N)
    echo "$round $side $(echo "$e - $s" | bc)"
  done
done
