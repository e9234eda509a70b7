from tokenpo.plan.cli import main

main()
