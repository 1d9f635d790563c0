# Experiment 67 on the GPU machine (from the repository root, carrying .abcache, after
#   rm -rf .abcache/base .abcache/e67 && mkdir -p .abcache/base .abcache/e67
#   git archive HEAD include python pyproject.toml | tar -x -C .abcache/base
#   tar -c include python tests pyproject.toml | tar -x -C .abcache/e67
# here, HEAD the commit before the change and the working tree with it): the pre-pass of both side by
# side with their lists compared, whole calls, then the changed tree's tests/gpu.
R=$PWD
pb() { (cd $1 && PYTHONPATH=$1/python:/tmp/site SPARSE_MLA_JIT_CACHE_DIR=$2 python3 -m sparse_mla prebuild --d-qk 576 --topk $3 -j 8 > /tmp/pb_$4.txt 2>&1; tail -1 /tmp/pb_$4.txt); }
pb $R/.abcache/base /tmp/j_base 2048 base & pb $R/.abcache/e67 /tmp/j_e67 "1 7 64 100 512 2048 4096" e67 & wait
(cd .abcache/e67 && PYTHONPATH=$R/.abcache/e67/python:/tmp/site SPARSE_MLA_JIT_CACHE_DIR=/tmp/j_e67 python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 8 | tail -1)
CASES=realistic-glm:131072:8,realistic-dsv4:131072:8,uniform:131072:8,realistic-glm:8192:8,realistic-glm:131072:16 \
  python3 benchmarks/experiments/token_groups/prepass_ab.py base=/tmp/j_base e67=/tmp/j_e67 base2=/tmp/j_base 2>&1 | tee $OUT/prepass_ab.txt | grep -v Warn
AB="python3 benchmarks/experiments/hazards/ab.py --iters 25 --variant base=/tmp/j_base --variant e67=/tmp/j_e67"
$AB --indices realistic-glm --shape 4096,131072,8,576,2048 --shape 4096,8192,8,576,2048 --json $OUT/ab_glm.json 2>&1 | tail -3
$AB --indices realistic-dsv4 --shape 4096,131072,8,576,2048 --json $OUT/ab_dsv4.json 2>&1 | tail -2
(cd .abcache/e67 && PYTHONPATH=$R/.abcache/e67/python:/tmp/site SPARSE_MLA_JIT_CACHE_DIR=/tmp/j_e67 \
  timeout 330 python3 -m pytest tests/gpu -q -rs -p no:cacheprovider > $OUT/tests_e67.txt 2>&1; tail -4 $OUT/tests_e67.txt)
