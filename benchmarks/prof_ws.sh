for c in ${PROFILE_CONFIGS:-g2_kv2_bk32_wu_only g2_kv2_bk32}; do
  ncu --clock-control none --set full --import-source no -k regex:gdn_fwd_intra_ws --launch-skip 1 --launch-count 1 -f -o $OUT/$c python3 -P benchmarks/gluon_ws_probe.py --profile $c > $OUT/ncu_$c.log 2>&1
  ncu --import $OUT/$c.ncu-rep --page details > $OUT/${c}_details.txt
  ncu --import $OUT/$c.ncu-rep --page source --print-source sass --csv > /tmp/$c.csv
  python3 benchmarks/ncu_stalls.py /tmp/$c.csv --top 16 > $OUT/${c}_stalls.txt
  cp /tmp/$c.csv $OUT/
done
