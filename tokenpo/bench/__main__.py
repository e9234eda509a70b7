from tokenpo.bench.cli import main

main()
