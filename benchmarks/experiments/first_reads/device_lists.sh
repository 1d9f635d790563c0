# Both changes at every key the tests use, then the token groups' GPU tests on each.
in_tree la python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 8 > /tmp/pb_la_all.txt 2>&1 &
in_tree lb python3 -m sparse_mla prebuild --d-qk 576 --topk 1 7 64 100 512 2048 4096 -j 8 > /tmp/pb_lb_all.txt 2>&1 &
wait
tail -n 1 /tmp/pb_la_all.txt /tmp/pb_lb_all.txt
for v in la lb; do
  in_tree $v python3 -m sparse_mla prebuild --d-qk 512 --topk 64 512 -j 8 | tail -n 1
  in_tree $v timeout 100 python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_token_groups.py 2>&1 | tail -n 3 | sed "s/^/$v: /"
done
